"""The named shapes match the real models' published configs (and so their parameter counts)."""

from __future__ import annotations

import pytest

from outpost.models import SHAPES
from outpost.models.shapes import get_shape
from outpost.models.synth import tensor_specs

# (layers, hidden, heads, kv heads, ffn, vocab, context, rope theta, rms eps) from each model's config.json
REAL = {
    "smollm2-135m": (30, 576, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5),
    "smollm2-360m": (32, 960, 15, 5, 2560, 49152, 8192, 100000.0, 1e-5),
    "smollm2-1.7b": (24, 2048, 32, 32, 8192, 49152, 8192, 130000.0, 1e-5),
    "qwen2.5-0.5b": (24, 896, 14, 2, 4864, 151936, 32768, 1000000.0, 1e-6),
}
# Parameter counts as published (tied embeddings counted once).
PARAMS = {"smollm2-135m": 134.5e6, "smollm2-360m": 361.8e6, "smollm2-1.7b": 1711.4e6, "qwen2.5-0.5b": 494.0e6}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_shapes_match_published_configs(name: str) -> None:
    s = SHAPES[name]
    got = (
        s.n_layer,
        s.n_embd,
        s.n_head,
        s.n_head_kv,
        s.n_ff,
        s.n_vocab,
        s.n_ctx_train,
        s.rope_theta,
        s.rms_eps,
    )
    assert got == REAL[name]
    assert s.tied_embeddings and s.head_dim == 64
    assert s.n_params() == pytest.approx(PARAMS[name], rel=0.005)


def test_architectures_and_biases() -> None:
    assert {s.arch for s in SHAPES.values()} == {"llama", "qwen2"}
    qwen = [t.name for t in tensor_specs(SHAPES["qwen2.5-0.5b"])]
    assert "blk.0.attn_q.bias" in qwen and "blk.23.attn_v.bias" in qwen and "output.weight" not in qwen
    llama = [t.name for t in tensor_specs(SHAPES["smollm2-135m"])]
    assert not any(n.endswith(".bias") for n in llama) and len(llama) == 2 + 30 * 9


def test_tiny_is_small_with_gqa() -> None:
    tiny = SHAPES["tiny"]
    assert tiny.n_head_kv < tiny.n_head and tiny.n_layer == 4 and tiny.n_vocab == 8192
    assert tiny.n_params() * 2 < 20e6  # f16 bytes


def test_unknown_shape_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="tiny, smollm2-135m"):
        get_shape("llama-70b")
