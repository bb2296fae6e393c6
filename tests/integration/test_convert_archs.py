"""Outpost's converter against the reference: tiny random HF models, converted, run by llama.cpp.

For every supported architecture (tied and untied embeddings, the rope scalings and sliding window
each supports, byte-level BPE and SentencePiece tokenizers), the GGUF that `outpost convert` writes
must tokenize a multilingual text exactly as the HF tokenizer does, and its logits at every position
must match PyTorch's: within a tight tolerance at f32, same argmax at >= 99% of 224 positions at f16,
>= 95% after q8_0 (Outpost's own q8_0 encoding and llama.cpp's quantizer from the f16 file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from convert_harness import (
    CHAT_TEMPLATE,
    N_PROMPTS,
    PROMPT_LEN,
    VARIANTS,
    Agreement,
    Variant,
    build_hf_model,
    compare,
    llama_logits,
    load_gguf,
    prompt_texts,
    sample_text,
    torch_logits,
    without_layers,
)

from outpost.engine.quantize import quantize_gguf
from outpost.models.convert import convert_model

pytestmark = pytest.mark.convert

F16_ARGMAX = 0.99
BF16_ARGMAX = 0.97  # bf16 keeps 8 bits of mantissa to f16's 11
Q8_ARGMAX = 0.95


class Built:
    """One variant's HF folder, reference logits and converted files (made once, on first use)."""

    def __init__(self, variant: Variant, root: Path) -> None:
        from transformers import AutoTokenizer

        self.variant = variant
        self.root = root
        self.hf_dir = root / "hf"
        self.model = model = build_hf_model(variant, self.hf_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.hf_dir)
        self.prompts = [
            self.tokenizer(t, add_special_tokens=False)["input_ids"][:PROMPT_LEN] for t in prompt_texts()
        ]
        assert len(self.prompts) == N_PROMPTS and all(len(p) == PROMPT_LEN for p in self.prompts)
        self.reference = torch_logits(model, self.prompts)
        self._gguf: dict[str, Path] = {}

    def gguf(self, outtype: str) -> Path:
        if outtype not in self._gguf:
            if outtype == "llama-q8_0":  # llama.cpp's quantizer on Outpost's f16 file
                path = self.root / "llama-q8_0.gguf"
                quantize_gguf(self.gguf("f16"), path, "q8_0", n_threads=2)
            else:
                path = convert_model(str(self.hf_dir), self.root / f"{outtype}.gguf", outtype=outtype)
            self._gguf[outtype] = path
        return self._gguf[outtype]

    def bf16_checkpoint_agreement(self) -> Agreement:
        """Outpost reading a bf16 checkpoint (as published models are), converted to f32, against
        the same bf16-rounded weights run by PyTorch in float32."""
        import copy

        import torch

        src = self.root / "hf-bf16"
        rounded = copy.deepcopy(self.model)
        with torch.no_grad():  # parameters only: rotary buffers stay exact, as llama.cpp computes them
            for param in rounded.parameters():
                param.copy_(param.to(torch.bfloat16).float())
        state = {name: value.to(torch.bfloat16) for name, value in rounded.state_dict().items()}
        rounded.save_pretrained(src, state_dict=state)
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "chat_template.jinja"):
            if (self.hf_dir / name).exists():
                (src / name).write_bytes((self.hf_dir / name).read_bytes())
        reference = torch_logits(rounded, self.prompts)
        path = convert_model(str(src), self.root / "from-bf16-f32.gguf", outtype="f32")
        with load_gguf(path) as model:
            return compare(reference, llama_logits(model, self.prompts))

    def agreement(self, outtype: str) -> Agreement:
        with load_gguf(self.gguf(outtype)) as model:
            return compare(self.reference, llama_logits(model, self.prompts))


_BUILT: dict[str, Built] = {}


@pytest.fixture(params=VARIANTS, ids=[v.id for v in VARIANTS])
def built(request: Any, tmp_path_factory: pytest.TempPathFactory) -> Built:
    variant: Variant = request.param
    if variant.id not in _BUILT:
        _BUILT[variant.id] = Built(variant, tmp_path_factory.mktemp(variant.id))
    return _BUILT[variant.id]


def test_reference_logits_are_peaked_and_use_the_layers(built: Built) -> None:
    """Argmax agreement only means something when the top token is clearly ahead, and checks the
    layers only when they decide the argmax at a fair share of positions."""
    logits = np.concatenate(built.reference)
    top2 = np.sort(logits, axis=-1)[:, -2:]
    assert np.median(top2[:, 1] - top2[:, 0]) > 0.4
    bare = np.concatenate(torch_logits(without_layers(built.model), built.prompts))
    changed = float(np.mean(bare.argmax(-1) != logits.argmax(-1)))
    print(f"\n{built.variant.id}: the layers change the argmax at {changed:.0%} of positions")
    assert changed > 0.15


def test_token_ids_match_hf_tokenizer(built: Built) -> None:
    text = sample_text(built.variant)
    expected = built.tokenizer(text)["input_ids"]
    with load_gguf(built.gguf("f16")) as model:
        got = model.vocab.tokenize(text, add_special=True, parse_special=False)
    assert got == expected


def test_special_tokens_and_chat_template(built: Built) -> None:
    tok = built.tokenizer
    with load_gguf(built.gguf("f16")) as model:
        assert model.metadata("tokenizer.chat_template") == CHAT_TEMPLATE
        assert model.vocab.bos == tok.bos_token_id
        assert model.vocab.eos == tok.eos_token_id
        chat = model.codec.render_chat([{"role": "user", "content": "hi"}], add_generation_prompt=True)
        assert (
            model.vocab.tokenize(chat, add_special=False) == tok(chat, add_special_tokens=False)["input_ids"]
        )


def test_f32_logits_match_pytorch(built: Built) -> None:
    result = built.agreement("f32")
    print(f"\n{built.variant.id} f32: {result}")
    assert result.max_abs_diff < built.variant.f32_atol, result
    assert result.argmax_agree == 1.0, result


def test_f16_argmax_agrees(built: Built) -> None:
    result = built.agreement("f16")
    print(f"\n{built.variant.id} f16: {result}")
    assert result.positions >= 200
    assert result.argmax_agree >= F16_ARGMAX, result


def test_bf16_argmax_agrees(built: Built) -> None:
    result = built.agreement("bf16")
    print(f"\n{built.variant.id} bf16: {result}")
    assert result.argmax_agree >= BF16_ARGMAX, result


def test_bf16_checkpoint_converts_exactly(built: Built) -> None:
    result = built.bf16_checkpoint_agreement()
    print(f"\n{built.variant.id} bf16 checkpoint -> f32: {result}")
    assert result.max_abs_diff < built.variant.f32_atol, result


@pytest.mark.parametrize("route", ["q8_0", "llama-q8_0"])
def test_q8_0_argmax_agrees(built: Built, route: str) -> None:
    result = built.agreement(route)
    print(f"\n{built.variant.id} {route}: {result}")
    assert result.argmax_agree >= Q8_ARGMAX, result
