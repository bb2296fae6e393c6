"""The repacked layout without AMX (outpost/engine/repack_overrides.py), on real llama.cpp.

Named tensor by tensor, the overrides bypass llama.cpp's own check of what the repack takes, so
these tests pin both halves: only repackable tensors are named, and a model loaded that way puts
them in CPU_REPACK and computes the same logits as the plain layout.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from outpost.engine import config as engine_config
from outpost.engine import cpu_probe
from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.lib import capture_log_lines, llama
from outpost.engine.model import LoadedModel
from outpost.engine.repack_overrides import repackable_tensor_patterns
from outpost.models import write_synthetic_model
from outpost.scheduler.output import BatchChunk

KINDS = ("attn_k", "attn_output", "attn_q", "attn_v", "ffn_down", "ffn_gate", "ffn_up")


@pytest.fixture(scope="module")
def tiny_quantized(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tiny model at a quant, written once per module per quant."""
    folder = tmp_path_factory.mktemp("models")
    written: dict[str, Path] = {}

    def model(quant: str) -> Path:
        if quant not in written:
            written[quant] = write_synthetic_model("tiny", folder / f"tiny-{quant}.gguf", quant=quant, seed=0)
        return written[quant]

    return model


def test_patterns_name_every_block_matmul_of_a_q4_0_model_and_nothing_else(
    tiny_quantized: Callable[[str], Path],
) -> None:
    patterns = repackable_tensor_patterns(str(tiny_quantized("q4_0")))
    assert patterns == [rf"^blk\.(0|1|2|3)\.{kind}\.weight$" for kind in KINDS]
    named = [re.compile(p) for p in patterns]
    for name in ("token_embd.weight", "output.weight", "blk.0.attn_norm.weight", "blk.10.ffn_up.weight"):
        assert not any(p.search(name) for p in named), name


def test_f16_weights_are_left_alone(tiny_model: Path) -> None:
    assert repackable_tensor_patterns(str(tiny_model)) == []


def _last_logits(layout: str, model_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, str]:
    monkeypatch.setattr(engine_config, "choose_layout", lambda repack, n_slots, gpu_layers=0: layout)
    buffers: list[str] = []
    with capture_log_lines(lambda line: buffers.append(line) if "model buffer size" in line else None):
        model = LoadedModel(EngineConfig(model_path=str(model_path), n_ctx=512, n_seq_max=4))
    try:
        prompt = model.vocab.tokenize("The river carried copper light past quiet markets", add_special=False)
        batch = TokenBatch(64)
        outputs = batch.fill([BatchChunk(0, list(prompt), 0, True)])
        assert llama.llama_decode(model.ctx, batch.struct) == 0
        return model.output_logits(outputs[0]), " ".join(buffers)
    finally:
        model.close()


def test_q4_k_m_names_its_q4_k_tensors_and_leaves_its_q6_k_ones(
    tiny_quantized: Callable[[str], Path],
) -> None:
    patterns = repackable_tensor_patterns(str(tiny_quantized("q4_K_M")))
    assert r"^blk\.(0|1|2|3)\.ffn_up\.weight$" in patterns
    # q4_K_M keeps attn_v and ffn_down at q6_K in some layers: those are not named
    assert not any(re.search(p, "blk.3.ffn_down.weight") for p in patterns)


@pytest.mark.parametrize("quant", ["q4_0", "q4_K_M"])
def test_repacked_without_amx_loads_into_cpu_repack_and_matches_plain(
    tiny_quantized: Callable[[str], Path], quant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_path = tiny_quantized(quant)
    repacked, repacked_buffers = _last_logits("repacked-no-amx", model_path, monkeypatch)
    plain, plain_buffers = _last_logits("plain", model_path, monkeypatch)
    assert "CPU_REPACK" in repacked_buffers and "CPU_REPACK" not in plain_buffers
    spread = float(plain.max() - plain.min())
    assert spread > 1.0  # peaked enough for the comparison to mean something
    assert float(np.max(np.abs(repacked - plain))) < 0.02 * spread
    top2 = np.sort(plain)[-2:]
    if top2[1] - top2[0] > 0.05 * spread:
        assert int(np.argmax(repacked)) == int(np.argmax(plain))


@pytest.mark.skipif(not cpu_probe.cpu_has_amx(), reason="this CPU has no AMX")
def test_amx_tiles_run_the_batched_matmul_of_outposts_build(
    tiny_quantized: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Outpost's install compiles llama.cpp with -fno-dse (scripts/install-llama-cpp.sh): built by
    gcc 12 without it, AMX's tile configuration is never filled and its first multi-token matmul
    dies. Probed in a child first, so a build made otherwise fails here instead of killing pytest."""
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    cpu_probe.amx_tiles_work.cache_clear()
    try:
        works = cpu_probe.amx_tiles_work()
    finally:
        cpu_probe.amx_tiles_work.cache_clear()
    assert works, "AMX tiles fault: llama-cpp-python was not compiled by scripts/install-llama-cpp.sh"
    model_path = tiny_quantized("q4_0")
    amx, amx_buffers = _last_logits("repacked", model_path, monkeypatch)  # a 12-token prompt: tiles
    plain, _ = _last_logits("plain", model_path, monkeypatch)
    assert "AMX" in amx_buffers
    spread = float(plain.max() - plain.min())
    assert spread > 1.0
    assert float(np.max(np.abs(amx - plain))) < 0.02 * spread
