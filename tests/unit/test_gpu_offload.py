"""GPU offload decisions with faked device lists and memory (no GPU here): llama.cpp's layer
placement, `-ngl auto`, sizing with weights and KV cache split between host and GPU memory, the
ready line, the device list read through ctypes, and the CPU-only engine paths skipped for GPU layers."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import pytest

from outpost.engine import cpu_probe
from outpost.engine.config import EngineConfig
from outpost.engine.devices import Device, list_devices, offload_targets
from outpost.sizing import Asked, Cores, Memory, ModelFootprint, NotEnoughMemory, plan, read_footprint
from outpost.sizing.offload import (
    GPU_RESERVE_BYTES,
    GPU_SAFETY_SHARE,
    Gpu,
    auto_layers,
    gpu_weight_bytes,
    offload_for,
    offloadable,
)
from outpost.sizing.plan import GPU_AUTO_SLOTS, MAX_AUTO_SLOTS

GiB = 1024**3
MiB = 1024**2

# SmolLM2-1.7B in f16: 24 blocks of ~100 MiB, a tied 49152 x 2048 embedding as the output layer.
LAYER = 100 * MiB
OUTPUT = 192 * MiB
SMOL17 = ModelFootprint(
    file_bytes=24 * LAYER + 2 * OUTPUT,  # the input embedding and the output layer
    n_layer=24,
    kv_heads_total=24 * 32,
    n_head=32,
    key_length=64,
    value_length=64,
    n_embd=2048,
    n_vocab=49152,
    n_ctx_train=8192,
    layer_bytes=(LAYER,) * 24,
    output_bytes=OUTPUT,
)
CELL = SMOL17.kv_bytes_per_cell()  # 196608 bytes
HOST = Memory(20 * GiB, "host MemAvailable")
CORES = Cores(16, "CPU affinity")


def _gpu(free_gib: float, total_gib: float = 80.0) -> Gpu:
    return Gpu("CUDA0", "NVIDIA H100 80GB HBM3", int(free_gib * GiB), int(total_gib * GiB))


# --- llama.cpp's placement ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("asked", "layers", "repeating", "weights", "n_gpu_layers"),
    [
        (0, 0, 0, 0, 0),
        (1, 1, 0, OUTPUT, 1),  # the output layer goes first
        (3, 3, 2, OUTPUT + 2 * LAYER, 3),
        (25, 25, 24, OUTPUT + 24 * LAYER, -1),
        (99, 25, 24, OUTPUT + 24 * LAYER, -1),
        (-1, 25, 24, OUTPUT + 24 * LAYER, -1),
    ],
)
def test_layers_follow_llama_cpp(
    asked: int, layers: int, repeating: int, weights: int, n_gpu_layers: int
) -> None:
    offload = offload_for(SMOL17, (_gpu(79),), asked)
    assert (offload.layers, offload.repeating, offload.weight_bytes) == (layers, repeating, weights)
    assert offload.n_gpu_layers == n_gpu_layers
    assert offload.kv_share == repeating / 24


def test_no_gpu_offloads_nothing_whatever_asked() -> None:
    for asked in (-1, 5, 99):
        offload = offload_for(SMOL17, (), asked)
        assert (offload.layers, offload.weight_bytes, offload.n_gpu_layers) == (0, 0, 0)


def test_split_mode_none_keeps_the_main_gpu_only() -> None:
    a, b = Gpu("CUDA0", "A", 10 * GiB, 16 * GiB), Gpu("CUDA1", "B", 12 * GiB, 16 * GiB)
    assert offloadable((a, b), "layer", 0) == (a, b)
    assert offloadable((a, b), "row", 0) == (a, b)
    assert offloadable((a, b), "none", 1) == (b,)
    assert offload_for(SMOL17, (a, b), 99).free == 22 * GiB


def test_weights_without_a_tensor_table_are_shared_evenly() -> None:
    bare = ModelFootprint(2500 * MiB, 24, 24 * 32, 32, 64, 64, 2048, 49152, 8192)
    assert gpu_weight_bytes(bare, 3) == 3 * (2500 * MiB // 25)


# --- -ngl auto ----------------------------------------------------------------------------------


def test_auto_offloads_every_layer_when_the_card_holds_them() -> None:
    assert auto_layers(SMOL17, (_gpu(79),), 512 * MiB, 16 * 2048, CELL) == 25


def test_auto_offloads_what_fits_and_no_more() -> None:
    gpu = _gpu(2.0, 8.0)
    other, cells = 256 * MiB, 4096
    layers = auto_layers(SMOL17, (gpu,), other, cells, CELL)
    room = int(gpu.free * (1 - GPU_SAFETY_SHARE)) - GPU_RESERVE_BYTES

    def need(n: int) -> int:
        offload = offload_for(SMOL17, (gpu,), n)
        return offload.weight_bytes + other + int(cells * CELL * offload.kv_share)

    assert 1 < layers < 25
    assert need(layers) <= room < need(layers + 1)


def test_auto_offloads_nothing_when_not_even_the_output_layer_fits() -> None:
    assert auto_layers(SMOL17, (_gpu(0.3, 8.0),), 0, 0, CELL) == 0


# --- sizing with a GPU --------------------------------------------------------------------------


def test_every_layer_on_the_gpu_sizes_the_kv_cache_from_gpu_memory() -> None:
    """4 GiB of host memory could not hold 16 slots x 8192 positions (24 GiB of KV cache); 79 GiB
    of free GPU memory can, and auto takes GPU_AUTO_SLOTS slots with every layer offloaded."""
    small_host = Memory(4 * GiB, "cgroup v2 memory.max")
    cpu_only = plan(SMOL17, small_host, CORES, Asked())
    assert cpu_only.n_ctx * CELL < 2 * GiB
    p = plan(SMOL17, small_host, CORES, Asked(gpu_layers=None), (_gpu(79),))
    assert (p.n_gpu_layers, p.slots, p.positions) == (-1, GPU_AUTO_SLOTS, 8192)
    assert p.kv_bytes == 16 * 8192 * CELL
    assert p.reserved_bytes < cpu_only.reserved_bytes  # the weights left the host
    assert "gpu layers" in p.auto
    why = p.why()
    assert "GPU: 24/24 layers + output on NVIDIA H100 80GB HBM3 (79.0 GiB free" in why
    assert "24.0 GiB KV there" in why


def test_partial_offload_keeps_the_cpu_slot_rule_and_splits_the_cache() -> None:
    p = plan(SMOL17, HOST, Cores(2, "CPU affinity"), Asked(gpu_layers=13), (_gpu(20),))
    assert p.offload is not None and p.offload.repeating == 12
    assert p.n_gpu_layers == 13 and p.slots == MAX_AUTO_SLOTS
    assert "12/24 layers + output" in p.why()


def test_an_explicit_context_the_gpu_cannot_hold_is_refused() -> None:
    asked = Asked(parallel=64, ctx_size=64 * 8192, gpu_layers=99)
    with pytest.raises(NotEnoughMemory, match=r"of GPU memory .* lower -c, -np or -ngl"):
        plan(SMOL17, HOST, CORES, asked, (_gpu(40),))
    fits = plan(SMOL17, HOST, CORES, Asked(parallel=64, ctx_size=64 * 1024, gpu_layers=99), (_gpu(40),))
    assert (fits.slots, fits.n_ctx, fits.n_gpu_layers) == (64, 65536, -1)


def test_a_cpu_build_sizes_as_before_and_says_why() -> None:
    before = plan(SMOL17, HOST, CORES, Asked())
    for layers in (None, 99):
        p = plan(SMOL17, HOST, CORES, Asked(gpu_layers=layers), ())
        assert (p.slots, p.n_ctx, p.threads, p.n_gpu_layers) == (
            before.slots,
            before.n_ctx,
            before.threads,
            0,
        )
        assert "no GPU in this llama.cpp build: every layer on the CPU" in p.why()
    assert "GPU" not in before.why()


def test_footprint_reads_each_blocks_bytes(tiny_model: Path) -> None:
    fp = read_footprint(tiny_model)
    assert len(fp.layer_bytes) == fp.n_layer == 4
    assert len(set(fp.layer_bytes)) == 1 and fp.layer_bytes[0] > 0
    assert fp.output_bytes > 0 and sum(fp.layer_bytes) + fp.output_bytes < fp.file_bytes


# --- the device list ----------------------------------------------------------------------------


class _FakeGgml:
    """ggml's device functions as plain Python: `devices` is (name, description, type, free, total)."""

    def __init__(self, devices: list[tuple[str, str, int, int, int]]) -> None:
        self.entries = devices

        def count() -> int:
            return len(self.entries)

        def get(i: int) -> int:
            return i + 1  # a non-null handle

        def memory(dev: int, free: Any, total: Any) -> None:
            free._obj.value, total._obj.value = self.entries[dev - 1][3:5]

        self.ggml_backend_dev_count = count
        self.ggml_backend_dev_get = get
        self.ggml_backend_dev_name = lambda dev: self.entries[dev - 1][0].encode()
        self.ggml_backend_dev_description = lambda dev: self.entries[dev - 1][1].encode()
        self.ggml_backend_dev_type = lambda dev: self.entries[dev - 1][2]
        self.ggml_backend_dev_memory = memory


def test_the_device_list_is_read_with_free_memory() -> None:
    lib = _FakeGgml(
        [("CPU", "AMD EPYC", 0, 20 * GiB, 24 * GiB), ("CUDA0", "NVIDIA H100", 1, 79 * GiB, 80 * GiB)]
    )
    devices = list_devices(lib)
    assert devices == [
        Device("CPU", "AMD EPYC", "cpu", 20 * GiB, 24 * GiB),
        Device("CUDA0", "NVIDIA H100", "gpu", 79 * GiB, 80 * GiB),
    ]
    assert lib.ggml_backend_dev_memory.argtypes[1] is ctypes.POINTER(ctypes.c_size_t)  # type: ignore[attr-defined]
    assert offload_targets(devices) == (Gpu("CUDA0", "NVIDIA H100", 79 * GiB, 80 * GiB),)


@pytest.mark.parametrize(
    ("kinds", "picked"),
    [
        (["cpu"], []),
        (["cpu", "accel"], []),  # BLAS and the like hold no layers
        (["cpu", "igpu"], ["igpu"]),
        (["cpu", "igpu", "gpu", "gpu"], ["gpu", "gpu"]),  # integrated ones only without a discrete GPU
    ],
)
def test_layers_go_to_gpus_else_integrated_ones(kinds: list[str], picked: list[str]) -> None:
    devices = [Device(f"D{i}", k, k, GiB, 2 * GiB) for i, k in enumerate(kinds)]  # type: ignore[arg-type]
    assert [g.description for g in offload_targets(devices)] == picked


# --- the engine's CPU-only paths ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("repack", "gpu_layers", "amx", "tiles", "layout"),
    [
        ("auto", -1, True, False, "plain"),  # every layer offloaded: no CPU weights, no probe
        ("auto", 10, True, False, "plain"),  # some: not the one-token mode, not the overrides
        ("auto", 10, True, True, "repacked"),
        ("auto", 10, False, False, "repacked"),
        ("on", -1, True, False, "repacked"),
        ("off", 10, False, False, "plain"),
    ],
)
def test_layouts_with_gpu_layers(
    monkeypatch: pytest.MonkeyPatch, repack: str, gpu_layers: int, amx: bool, tiles: bool, layout: str
) -> None:
    monkeypatch.setattr(cpu_probe, "cpu_has_amx", lambda: amx)

    def probe() -> bool:
        assert gpu_layers > 0, "the AMX probe ran with every layer on the GPU"
        return tiles

    monkeypatch.setattr(cpu_probe, "amx_tiles_work", probe)
    assert cpu_probe.choose_layout(repack, 1, gpu_layers) == layout  # type: ignore[arg-type]


def test_engine_config_with_every_layer_on_the_gpu(monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> None:
    monkeypatch.setattr(cpu_probe, "cpu_has_amx", lambda: True)
    monkeypatch.setattr(cpu_probe, "amx_tiles_work", lambda: pytest.fail("probed"))
    cfg = EngineConfig(model_path=str(tiny_model), n_gpu_layers=-1, n_seq_max=1)
    assert (cfg.weight_layout, cfg.use_extra_bufts, cfg.use_repack_overrides) == ("plain", False, False)
    assert cfg.effective_n_ubatch == 512  # never the one-token micro-batch
    assert cfg.effective_flash_attn == "auto"  # llama.cpp's own choice on the GPU
    assert EngineConfig(model_path=str(tiny_model)).effective_flash_attn == "off"


# --- serve and worker: -ngl auto ----------------------------------------------------------------


def test_ngl_flag_takes_auto_on_serve_worker_and_environment() -> None:
    from outpost.cli import build_parser
    from outpost.envflags import use_environment
    from outpost.settings import EngineSettings

    parser = build_parser()
    assert EngineSettings.from_args(parser.parse_args(["serve", "-ngl", "auto"])).n_gpu_layers == "auto"
    assert EngineSettings.from_args(parser.parse_args(["worker", "-ngl", "12"])).n_gpu_layers == 12
    argv = ["serve"]
    use_environment(parser, argv, {"OUTPOST_N_GPU_LAYERS": "auto"})
    assert parser.parse_args(argv).n_gpu_layers == "auto"
    assert EngineSettings().n_gpu_layers == 0
    with pytest.raises(ValueError):
        EngineSettings(n_gpu_layers=-2)


def test_sizing_reads_the_gpus_only_when_layers_are_asked_for(
    monkeypatch: pytest.MonkeyPatch, tiny_model: Path
) -> None:
    from outpost.commands.engine import engine_config, sized
    from outpost.engine import devices
    from outpost.settings import EngineSettings

    model = str(tiny_model)
    assert engine_config(EngineSettings(n_gpu_layers="auto"), model).n_gpu_layers == 0  # not sized yet
    monkeypatch.setattr(devices, "gpu_devices", lambda: pytest.fail("read the GPUs for -ngl 0"))
    cpu, _ = sized(EngineSettings(), model)
    assert cpu.n_gpu_layers == 0
    monkeypatch.setattr(devices, "gpu_devices", lambda: (_gpu(79),))
    gpu, p = sized(EngineSettings(n_gpu_layers="auto"), model)
    assert (gpu.n_gpu_layers, gpu.parallel) == (-1, GPU_AUTO_SLOTS)
    engine = engine_config(gpu, model)
    assert (engine.n_gpu_layers, engine.weight_layout, engine.effective_flash_attn) == (-1, "plain", "auto")
    assert "GPU: 4/4 layers + output on NVIDIA H100 80GB HBM3" in p.why()
    monkeypatch.setattr(devices, "gpu_devices", lambda: ())
    none, p = sized(EngineSettings(n_gpu_layers=99), model)
    assert none.n_gpu_layers == 0 and engine_config(none, model).effective_flash_attn == "off"
    assert "no GPU in this llama.cpp build" in p.why()


def test_run_sizes_auto_gpu_layers_as_serve_does(monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> None:
    """`outpost run -ngl auto` puts as many layers on the GPU as serve's sizing would: every layer
    of a model the (fake) GPU holds, none where the build has no GPU."""
    from outpost.cli import build_parser
    from outpost.engine import devices
    from outpost.run import _engine_config

    args = build_parser().parse_args(["run", "-m", str(tiny_model), "-ngl", "auto"])
    monkeypatch.setattr(devices, "gpu_devices", lambda: (_gpu(79),))
    assert _engine_config(args, 0).n_gpu_layers == -1
    monkeypatch.setattr(devices, "gpu_devices", lambda: ())
    assert _engine_config(args, 0).n_gpu_layers == 0
