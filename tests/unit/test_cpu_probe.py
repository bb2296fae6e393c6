"""Weight layout choice: AMX's tile path is probed once per machine and cached; the choice maps to
llama.cpp's extra buffer types and the micro-batch size. No real probe runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from outpost.engine import config as engine_config
from outpost.engine import cpu_probe
from outpost.engine.config import EngineConfig


@pytest.mark.parametrize(
    ("repack", "amx", "tiles", "slots", "layout"),
    [
        ("auto", False, False, 8, "repacked"),
        ("auto", True, True, 8, "repacked"),
        ("auto", True, False, 1, "amx-gemv"),
        ("auto", True, False, 2, "amx-gemv"),
        ("auto", True, False, 4, "plain"),
        ("off", True, False, 1, "plain"),
        ("on", True, False, 1, "repacked"),
    ],
)
def test_layout_choice(
    monkeypatch: pytest.MonkeyPatch, repack: str, amx: bool, tiles: bool, slots: int, layout: str
) -> None:
    monkeypatch.setattr(cpu_probe, "cpu_has_amx", lambda: amx)
    monkeypatch.setattr(cpu_probe, "amx_tiles_work", lambda: tiles)
    assert cpu_probe.choose_layout(repack, slots) == layout  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layout", "extra_bufts", "ubatch"),
    [("repacked", True, 256), ("plain", False, 256), ("amx-gemv", True, 1)],
)
def test_layout_sets_buffers_and_micro_batch(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Path, layout: str, extra_bufts: bool, ubatch: int
) -> None:
    monkeypatch.setattr(engine_config, "choose_layout", lambda repack, n_slots: layout)
    cfg = EngineConfig(model_path=str(tiny_model), n_batch=256, n_ubatch=512)
    assert (cfg.use_extra_bufts, cfg.effective_n_ubatch) == (extra_bufts, ubatch)


def test_probe_runs_once_per_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    runs: list[int] = []

    def fake_probe() -> bool:
        runs.append(1)
        return False

    monkeypatch.setattr(cpu_probe, "_run_probe", fake_probe)
    cpu_probe.amx_tiles_work.cache_clear()
    try:
        assert cpu_probe.amx_tiles_work() is False
        cpu_probe.amx_tiles_work.cache_clear()  # a new process: reads the file, no new probe
        assert cpu_probe.amx_tiles_work() is False
        assert len(runs) == 1
        saved = tmp_path / "probe" / "amx.json"
        saved.write_text(json.dumps({"key": "another machine", "tiles_work": True}))
        cpu_probe.amx_tiles_work.cache_clear()
        assert cpu_probe.amx_tiles_work() is False and len(runs) == 2  # other key: probed again
    finally:
        cpu_probe.amx_tiles_work.cache_clear()
