"""The reference the real tier compares Outpost with: llama-cpp-python's high-level `Llama` (its own
context, batches and sampler) greedy-decoding the same prompt tokens, and the GGUF's chat template
rendered by `transformers` (Hugging Face's renderer, what the template was written for).

Every greedy generation starts from a reset context: `Llama.generate` would otherwise reuse a cached
prefix and evaluate the rest of a prompt in other batch shapes than a fresh run.

The reference runs the kernels Outpost's engine runs on this CPU for the same number of slots, so that
parity holds whatever the CPU: the weight layout is chosen by outpost/engine/cpu_probe.py. Where AMX
tiles fault, Outpost keeps AMX's layout with one token per micro-batch for 1-2 slots, and so does the
reference (`n_ubatch=1`; `Llama`'s default would run the tile kernel on its prompt and die of the
fault); for more slots Outpost repacks only q4_0/q4_K tensors without AMX, which on a model with none
(SmolLM2's q4_1) is the plain layout. Across layouts logits differ by far more than rounding within
one: 0.65 logits among the top 10, measured between AMX's and the plain layout on an Intel Xeon.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama

from outpost.engine.cpu_probe import WeightLayout, choose_layout
from outpost.engine.repack_overrides import repackable_tensor_patterns


@contextlib.contextmanager
def _plain_layout() -> Iterator[None]:
    """`Llama` loads the model with llama.cpp's extra buffer types off (it has no argument for it)."""
    bindings = llama_cpp.llama_cpp  # the module `Llama` reads its defaults from
    default = bindings.llama_model_default_params

    def plain() -> llama_cpp.llama_model_params:
        params = default()
        params.use_extra_bufts = False
        return params

    bindings.llama_model_default_params = plain
    try:
        yield
    finally:
        bindings.llama_model_default_params = default


@dataclass(frozen=True)
class Greedy:
    tokens: list[int]
    text: str
    stopped: bool  # ended on an end-of-generation token (not the token limit)


class Reference:
    """One `Llama` over a model file, used for greedy text, tokens and next-token logits."""

    def __init__(self, path: Path, n_ctx: int = 2048, n_slots: int = 1) -> None:
        self.layout: WeightLayout = choose_layout("auto", n_slots=n_slots)  # Outpost's, with n_slots
        plain = self.layout == "plain" or self.layout == "repacked-no-amx"
        if self.layout == "repacked-no-amx" and repackable_tensor_patterns(str(path)):
            raise ValueError(f"{path.name}: Llama cannot repack some tensors only, as Outpost does here")
        with _plain_layout() if plain else contextlib.nullcontext():
            # One thread, as the Outpost processes under test: on a CPU shared with other work a
            # second OpenMP thread that gets descheduled stalls every op (measured: 127 ms a token
            # with one thread, 3.4 s with two, at a load of 11 on 2 cores).
            self.llm = Llama(
                model_path=str(path),
                n_ctx=n_ctx,
                n_threads=1,
                n_threads_batch=1,
                n_batch=512,
                n_ubatch=1 if self.layout == "amx-gemv" else 512,
                seed=0,
                verbose=False,
            )
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self._greedy: dict[tuple[tuple[int, ...], int], Greedy] = {}

    @property
    def template(self) -> str | None:
        return self.llm.metadata.get("tokenizer.chat_template")

    def token_text(self, token_id: int) -> str:
        return self.llm.detokenize([token_id], special=True).decode("utf-8", errors="replace")

    def tokenize(self, text: str) -> list[int]:
        """As Outpost tokenizes a prompt: the vocab's own BOS rule, special tokens parsed."""
        return self.llm.tokenize(text.encode(), add_bos=True, special=True)

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def greedy(self, prompt: list[int], max_tokens: int) -> Greedy:
        """Greedy continuation of `prompt` until an end-of-generation token or `max_tokens` (computed
        once per prompt: the tests ask for the same ones several times)."""
        key = (tuple(prompt), max_tokens)
        if key not in self._greedy:
            self._greedy[key] = self._generate(prompt, max_tokens)
        return self._greedy[key]

    def _generate(self, prompt: list[int], max_tokens: int) -> Greedy:
        self.llm.reset()
        out: list[int] = []
        stopped = False
        for token in self.llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
            if self.is_eog(token):
                stopped = True
                break
            out.append(token)
            if len(out) >= max_tokens:
                break
        text = self.llm.detokenize(out).decode("utf-8", errors="replace")
        return Greedy(out, text, stopped)

    def next_logits(self, tokens: list[int]) -> np.ndarray:
        """The logits after `tokens`, from a fresh evaluation."""
        self.llm.reset()
        self.llm.eval(tokens)
        n_vocab = self.llm.n_vocab()
        row = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(
            ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), shape=(n_vocab,)
        ).copy()

    def close(self) -> None:
        self.llm.close()


def render_reference(template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    """transformers' rendering of `template` (its sandbox, filters and globals)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[messages], chat_template=template, add_generation_prompt=True, **kwargs
    )
    return str(rendered[0])


def first_difference(a: str, b: str) -> str:
    """Where two texts part, for assertion messages."""
    i = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (
        f"they part at character {i}: ...{a[max(0, i - 30) : i + 30]!r} vs ...{b[max(0, i - 30) : i + 30]!r}"
    )
