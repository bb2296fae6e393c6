"""The reference the real tier compares Outpost with: llama-cpp-python's high-level `Llama` (its own
context, batches and sampler) greedy-decoding the same prompt tokens, and the GGUF's chat template
rendered by `transformers` (Hugging Face's renderer, what the template was written for).

Every greedy generation starts from a reset context: `Llama.generate` would otherwise reuse a cached
prefix and evaluate the rest of a prompt in other batch shapes than a fresh run.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import Llama


@dataclass(frozen=True)
class Greedy:
    tokens: list[int]
    text: str
    stopped: bool  # ended on an end-of-generation token (not the token limit)


class Reference:
    """One `Llama` over a model file, used for greedy text, tokens and next-token logits."""

    def __init__(self, path: Path, n_ctx: int = 2048) -> None:
        # One thread, as the Outpost processes under test: on a CPU shared with other work a second
        # OpenMP thread that gets descheduled stalls every op (measured: 127 ms a token with one
        # thread, 3.4 s with two, at a load of 11 on 2 cores).
        self.llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=1,
            n_threads_batch=1,
            n_batch=512,
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
