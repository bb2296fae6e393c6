"""The kernel probe for real: its child process decodes every variant of a real model, the choice is
cached per machine, and an engine started with `auto` settings runs what was chosen and says so.
Which variant wins is this machine's business: the test checks that it was measured and obeyed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from outpost.engine import kernel_probe
from outpost.engine.config import EngineConfig
from outpost.serving.assembly import Engine
from outpost.serving.local_backend import LocalBackend


def test_probe_measures_caches_and_the_engine_obeys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model: Path
) -> None:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    monkeypatch.setenv("OUTPOST_KERNEL_PROBE", "on")
    # A small probe, and no deadline but pytest's own: a busy machine only makes it slower.
    small = (
        ("PROBE_DEPTH", 32),
        ("PROBE_STEPS", 2),
        ("PROBE_ROUNDS", 2),
        ("PROBE_SHAPE", "tiny"),
    )
    for name, value in small:
        monkeypatch.setattr(kernel_probe, name, value)
    monkeypatch.setattr(
        kernel_probe, "machine_busy", lambda load, cpus: False
    )  # unit-tested; a suite loads it
    monkeypatch.setattr(kernel_probe, "PROBE_TIMEOUT_S", 3600.0)
    kernel_probe.kernel_choice.cache_clear()
    try:
        choice = kernel_probe.kernel_choice(4)  # the Engine's 4 slots below
        assert choice is not None and "not measured" not in choice.why
        saved = json.loads((tmp_path / "probe" / "kernels-w4.json").read_text())
        assert set(saved["rates"]) == {"default", *kernel_probe.TOGGLES}
        assert all(r["many"] > 0 and r["one"] > 0 and len(r["rounds"]) == 2 for r in saved["rates"].values())
        assert Path(saved["model"]).name == "tiny-q4_0.gguf"  # the probe's own model, written once
        with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_seq_max=4)) as engine:
            assert engine.kernels == choice
            config = engine.model.config
            assert config.effective_flash_attn == ("on" if choice.flash_attn else "off")
            assert engine.model.kv_unified == choice.kv_unified
            assert (config.weight_layout == "plain") == (choice.layout == "plain")
            serving = LocalBackend(engine).describe()["serving"]  # the ready line's engine part
            assert f"auto kernels: {choice.describe()}" in serving
    finally:
        kernel_probe.kernel_choice.cache_clear()
