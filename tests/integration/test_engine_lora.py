"""A LoRA adapter's effect in real llama.cpp, checked against numpy (tiny synthetic model).

The adapter (`outpost models synth --lora`'s writer) changes only the output projection W
(`output.weight`), which llama.cpp applies through build_lora_mm: logits = h @ (W + s * alpha / r *
B @ A)^T, h the final normed hidden state. h is read from an embeddings context on the same model
(pooling none: llama.cpp's `t_embd`, the output norm's result); the adapter leaves it alone, since
no weight before the output projection changes. Compared within a float tolerance: llama.cpp's f16
matrix products round the activations, which numpy's float64 does not, so the bound is relative
to the logits' size (measured: under 1e-3 of the largest).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel, ModelLoadError
from outpost.models.lora import check_lora_adapter, write_lora_adapter
from outpost.scheduler.output import BatchChunk

RANK, ALPHA = 4, 8.0  # alpha / r = 2: the alpha factor shows in the result
# Relative to the largest logit (tens of units): llama.cpp's f16 products round the activations.
RTOL = 3e-3


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora_adapter("tiny", tmp_path_factory.mktemp("lora") / "a.gguf", RANK, ALPHA, seed=3)


@pytest.fixture(scope="module")
def model(tiny_model: Path, adapter: Path) -> Iterator[LoadedModel]:
    config = EngineConfig(model_path=str(tiny_model), n_ctx=256, n_seq_max=1, lora_adapters=(str(adapter),))
    loaded = LoadedModel(config)
    yield loaded
    loaded.close()


def _tensor(path: Path, name: str) -> np.ndarray:
    found = next(t for t in GGUFReader(path).tensors if t.name == name)
    return np.asarray(found.data, dtype=np.float64).reshape([int(d) for d in reversed(found.shape)])


def _hidden(model: LoadedModel, tokens: list[int]) -> np.ndarray:
    """The last token's normed final hidden state, from an embeddings context (pooling none)."""
    params = llama.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = 256, 256, 256
    params.embeddings = True
    params.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
    ctx = llama.llama_init_from_model(model.model, params)
    assert ctx
    try:
        batch = TokenBatch(256)
        index = batch.fill([BatchChunk(0, tokens, 0, True)])[0]
        assert llama.llama_decode(ctx, batch.struct) == 0
        n_embd = int(llama.llama_model_n_embd(model.model))
        row = llama.llama_get_embeddings_ith(ctx, index)
        return np.ctypeslib.as_array(ctypes.cast(row, ctypes.POINTER(ctypes.c_float)), (n_embd,)).astype(
            np.float64
        )
    finally:
        llama.llama_free(ctx)


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert np.max(np.abs(got - want)) < RTOL * np.max(np.abs(want))


def _logits(model: LoadedModel, tokens: list[int]) -> np.ndarray:
    llama.llama_memory_clear(model.memory, True)
    batch = TokenBatch(256)
    index = batch.fill([BatchChunk(0, tokens, 0, True)])[0]
    assert llama.llama_decode(model.ctx, batch.struct) == 0
    return model.output_logits(index).astype(np.float64)


def test_logits_are_the_adapted_projection_of_the_hidden_state(
    model: LoadedModel, tiny_model: Path, adapter: Path
) -> None:
    tokens = model.vocab.tokenize("The river runs past the old mill", add_special=True)
    h = _hidden(model, tokens)
    w = _tensor(tiny_model, "output.weight")
    delta = _tensor(adapter, "output.weight.lora_b") @ _tensor(adapter, "output.weight.lora_a")
    assert model.adapters is not None
    model.adapters.apply(model.ctx, ())
    base = _logits(model, tokens)
    _assert_close(base, h @ w.T)
    for scale in (1.0, 0.25):
        model.apply_lora(((0, scale),))
        got = _logits(model, tokens)
        want = h @ (w + scale * ALPHA / RANK * delta).T
        _assert_close(got, want)
        assert np.max(np.abs(got - base)) > 0.1 * np.max(np.abs(base))  # the adapter did move them
    model.adapters.apply(model.ctx, ((0, 0.0),))  # scale 0 as llama.cpp gets it: the base model
    _assert_close(_logits(model, tokens), base)


def test_a_wrong_adapter_is_refused_before_and_by_llama_cpp(tiny_model: Path, tmp_path: Path) -> None:
    """Another shape's adapter: the header check names the tensor, llama.cpp refuses it too."""
    other = write_lora_adapter("smollm2-135m", tmp_path / "other.gguf", targets=("blk.0.ffn_up.weight",))
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight"):
        check_lora_adapter(str(other), str(tiny_model))
    config = EngineConfig(model_path=str(tiny_model), n_ctx=256, n_seq_max=1, lora_adapters=(str(other),))
    with pytest.raises(ModelLoadError, match="LoRA adapter"):
        LoadedModel(config)
