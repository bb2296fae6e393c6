"""llama.cpp's device list as Outpost reads it, on the CPU build the tests run with: the CPU device
with the host's memory, and no GPU, so `-ngl auto` offloads nothing and -ngl 99 loads on the CPU."""

from __future__ import annotations

from pathlib import Path

from outpost.engine.config import EngineConfig
from outpost.engine.devices import gpu_devices, list_devices
from outpost.engine.model import LoadedModel


def test_a_cpu_build_lists_the_cpu_and_no_gpu() -> None:
    devices = list_devices()
    cpus = [d for d in devices if d.kind == "cpu"]
    assert len(cpus) == 1 and cpus[0].total >= cpus[0].free > 0
    assert not [d for d in devices if d.kind in ("gpu", "igpu")]
    assert gpu_devices() == ()


def test_all_layers_asked_on_a_cpu_build_load_on_the_cpu(tiny_model: Path) -> None:
    cfg = EngineConfig(model_path=str(tiny_model), n_ctx=256, n_seq_max=1, n_gpu_layers=-1)
    with LoadedModel(cfg) as model:
        assert model.n_ctx == 256 and model.describe()["n_vocab"] == 8192
