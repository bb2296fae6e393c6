"""The kernel probe's decisions for every CPU family, from made-up rates (one machine shows one CPU),
its cache, and how a choice lands in an EngineConfig. No real probe runs here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from outpost.engine import config as engine_config
from outpost.engine import kernel_probe
from outpost.engine.config import EngineConfig, with_probed_kernels
from outpost.engine.kernel_probe import KernelChoice, Rates, cpu_family, decide

INTEL = "vendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu sse avx2 {extra}\n"
AMD = "vendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 {extra}\n"
ARM = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n"


@pytest.mark.parametrize(
    ("cpuinfo", "machine", "amx_works", "family"),
    [
        (INTEL.format(extra="avx512f amx_tile amx_int8"), "x86_64", False, "intel-amx-fault"),
        (INTEL.format(extra="avx512f amx_tile amx_int8"), "x86_64", True, "intel-amx"),
        (INTEL.format(extra="avx512f avx512_vnni"), "x86_64", None, "intel-avx512"),
        (INTEL.format(extra="fma"), "x86_64", None, "intel-avx2"),
        (AMD.format(extra="avx512f avx512bw"), "x86_64", None, "amd-avx512"),
        (AMD.format(extra="fma"), "x86_64", None, "amd-avx2"),
        (ARM, "aarch64", None, "arm"),
        ("vendor_id\t: HygonGenuine\nflags\t\t: avx2\n", "x86_64", None, "other"),
    ],
)
def test_cpu_family(cpuinfo: str, machine: str, amx_works: bool | None, family: str) -> None:
    assert cpu_family(cpuinfo, machine, amx_works) == family


def rates(default: tuple[float, float], **toggles: tuple[float, float]) -> dict[str, Rates]:
    return {"default": Rates(*default), **{k: Rates(*v) for k, v in toggles.items()}}


# (family, measured rates (x8, x1), expected (flash attention, layout, one KV pool)). The rates echo
# what each family showed: the Intel VMs lost with flash attention at depth, the AMD EPYC won with it;
# a lone sequence counts too (the geometric mean), and differences within MARGIN keep the default.
CASES = [
    # Intel whose AMX tiles fault: flash attention slower, CPU_REPACK alone beats plain weights.
    (
        "intel-amx-fault",
        rates((283, 95), flash_attn=(236, 90), layout=(240, 88), kv_unified=(241, 96)),
        (False, "repacked", False),
    ),
    # Intel with working AMX: its repacked (AMX) layout far ahead, one pool no better.
    (
        "intel-amx",
        rates((420, 160), flash_attn=(425, 158), layout=(250, 90), kv_unified=(400, 160)),
        (False, "repacked", False),
    ),
    # Intel AVX2: flash attention a little faster, but within the margin: the default stays.
    (
        "intel-avx2",
        rates((300, 120), flash_attn=(306, 121), layout=(280, 118), kv_unified=(290, 119)),
        (False, "repacked", False),
    ),
    # AMD EPYC with AVX-512: flash attention clearly faster (383 vs 320 in llama-batched-bench).
    (
        "amd-avx512",
        rates((320, 180), flash_attn=(383, 183), layout=(300, 170), kv_unified=(280, 181)),
        (True, "repacked", False),
    ),
    # AMD AVX2 (Zen 2/3): flash attention and the plain layout both measured faster: both taken.
    (
        "amd-avx2",
        rates((300, 170), flash_attn=(350, 172), layout=(330, 185), kv_unified=(290, 171)),
        (True, "plain", False),
    ),
    # ARM: the plain layout must win by twice the margin (6% is not enough); one pool wins here.
    (
        "arm",
        rates((200, 80), flash_attn=(190, 80), layout=(212, 85), kv_unified=(230, 84)),
        (False, "repacked", True),
    ),
    (
        "arm",
        rates((200, 80), flash_attn=(190, 80), layout=(240, 90), kv_unified=(200, 80)),
        (False, "plain", False),
    ),
]


@pytest.mark.parametrize(("family", "measured", "expected"), CASES)
def test_decide_per_family(family: str, measured: dict[str, Rates], expected: tuple[bool, str, bool]) -> None:
    choice = decide(family, measured)  # type: ignore[arg-type]
    assert (choice.flash_attn, choice.layout, choice.kv_unified) == expected
    assert choice.family == family
    assert "tok/s" in choice.why and "fa on" in choice.why  # the ready line says what it measured


def test_a_lone_sequence_is_not_sacrificed_for_batches() -> None:
    # +10% for 8 sequences but -20% for one: the geometric mean falls, the default stays.
    choice = decide("amd-avx512", rates((300, 150), flash_attn=(330, 120)))
    assert not choice.flash_attn


@pytest.mark.parametrize("measured", [{}, {"default": Rates(0.0, 0.0)}, {"flash_attn": Rates(400, 200)}])
def test_nothing_believable_keeps_the_defaults(measured: dict[str, Rates]) -> None:
    choice = decide("amd-avx512", measured)
    assert (choice.flash_attn, choice.layout, choice.kv_unified) == (False, "repacked", False)
    assert "not measured" in choice.why


def test_a_toggle_must_win_every_round() -> None:
    # +17% in the median, but the default won the second round: a load that moved, not the kernels.
    base = Rates.from_rounds([300, 300, 300], [150, 150, 150])
    moved = Rates.from_rounds([360, 250, 350], [180, 140, 170])
    choice = decide("amd-avx2", {"default": base, "flash_attn": moved})
    assert not choice.flash_attn and "not every round" in choice.why
    steady = Rates.from_rounds([330, 340, 350], [160, 170, 165])
    assert decide("amd-avx2", {"default": base, "flash_attn": steady}).flash_attn


@pytest.mark.parametrize(
    ("load", "cpus", "busy"), [(0.8, 2, False), (1.9, 2, False), (2.0, 2, True), (3.5, 16, False)]
)
def test_a_busy_machine_is_not_probed(load: float, cpus: int, busy: bool) -> None:
    assert kernel_probe.machine_busy(load, cpus) is busy


@pytest.fixture
def fake_probe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """A probe that records its runs and measures flash attention clearly faster, on a quiet machine."""
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    monkeypatch.setenv("OUTPOST_KERNEL_PROBE", "on")
    monkeypatch.setattr(kernel_probe, "this_cpu_family", lambda: "amd-avx512")
    monkeypatch.setattr(kernel_probe, "_probe_model", lambda: tmp_path / "probe.gguf")
    monkeypatch.setattr(kernel_probe.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    runs: list[str] = []

    def run(model_path: str, width: int) -> dict[str, Rates]:
        runs.append(f"{model_path} x{width}")
        return rates((320, 180), flash_attn=(383, 183) if width >= 8 else (300, 170))

    monkeypatch.setattr(kernel_probe, "_run_probe", run)
    kernel_probe.kernel_choice.cache_clear()
    yield runs
    kernel_probe.kernel_choice.cache_clear()


def test_choice_is_cached_per_machine(
    fake_probe: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert kernel_probe.kernel_choice(16) is not None
    kernel_probe.kernel_choice.cache_clear()  # a new process: reads the file, no new probe
    cached = kernel_probe.kernel_choice(16)
    assert cached is not None and cached.flash_attn and len(fake_probe) == 1
    assert "x16" in cached.why
    saved = json.loads((tmp_path / "probe" / "kernels-w16.json").read_text())
    assert saved["rates"]["flash_attn"]["many"] == 383
    saved["key"] = "another CPU"
    (tmp_path / "probe" / "kernels-w16.json").write_text(json.dumps(saved))
    kernel_probe.kernel_choice.cache_clear()
    kernel_probe.kernel_choice(16)
    assert len(fake_probe) == 2  # another machine's answer is not reused
    monkeypatch.setenv("OUTPOST_KERNEL_PROBE", "off")
    kernel_probe.kernel_choice.cache_clear()
    assert kernel_probe.kernel_choice() is None


def test_each_width_is_probed_and_cached_on_its_own(fake_probe: list[str], tmp_path: Path) -> None:
    """A server's slots are the width it is probed at (at most MAX_PROBE_WIDTH); the answers differ
    (this fake measures flash attention faster from 8 sequences on) and live side by side."""
    wide, narrow = kernel_probe.kernel_choice(16), kernel_probe.kernel_choice(4)
    assert wide is not None and wide.flash_attn
    assert narrow is not None and not narrow.flash_attn
    kernel_probe.kernel_choice.cache_clear()
    assert kernel_probe.kernel_choice(16) == wide and kernel_probe.kernel_choice(4) == narrow
    assert [run.rsplit(" ", 1)[1] for run in fake_probe] == ["x16", "x4"]
    assert {p.name for p in (tmp_path / "probe").glob("kernels*.json")} == {
        "kernels-w16.json",
        "kernels-w4.json",
    }
    assert kernel_probe.probe_width(64) == kernel_probe.MAX_PROBE_WIDTH == 32
    assert kernel_probe.probe_width(0) == 1


def test_a_server_is_probed_at_its_slot_count(monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> None:
    asked: list[int] = []
    choice = KernelChoice(True, "repacked", False, "amd-avx2", "x")
    monkeypatch.setattr(engine_config, "kernel_choice", lambda width: asked.append(width) or choice)
    for slots in (16, 64):
        with_probed_kernels(EngineConfig(model_path=str(tiny_model), n_seq_max=slots))
    assert asked == [16, 32]


def test_the_probe_is_on_by_default(fake_probe: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OUTPOST_KERNEL_PROBE")
    choice = kernel_probe.kernel_choice()
    assert choice is not None and choice.flash_attn and len(fake_probe) == 1


def test_a_busy_or_failed_probe_is_not_cached(
    fake_probe: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kernel_probe.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert kernel_probe.kernel_choice() is None and fake_probe == []
    monkeypatch.setattr(kernel_probe.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(kernel_probe, "_run_probe", lambda model_path, width: {})
    kernel_probe.kernel_choice.cache_clear()
    assert kernel_probe.kernel_choice() is None  # failed: the defaults, and no answer saved
    assert not list((tmp_path / "probe").glob("kernels*.json"))


@pytest.mark.parametrize(
    ("choice", "asked", "expected"),
    [
        (KernelChoice(True, "plain", True, "amd-avx2", "x"), {}, ("on", "off", "on")),
        (KernelChoice(False, "repacked", False, "intel-avx2", "x"), {}, ("off", "auto", "auto")),
        # What the user set explicitly stays as set.
        (
            KernelChoice(True, "plain", True, "amd-avx2", "x"),
            {"flash_attn": "off", "repack": "on"},
            ("off", "on", "on"),
        ),
    ],
)
def test_choice_applies_to_auto_settings_only(
    monkeypatch: pytest.MonkeyPatch,
    tiny_model: Path,
    choice: KernelChoice,
    asked: dict[str, str],
    expected: tuple[str, str, str],
) -> None:
    monkeypatch.setattr(engine_config, "kernel_choice", lambda width: choice)
    cfg, got = with_probed_kernels(EngineConfig(model_path=str(tiny_model), **asked))  # type: ignore[arg-type]
    assert got is choice
    assert (cfg.flash_attn, cfg.repack, cfg.kv_unified) == expected
    amx_fault = KernelChoice(False, "plain", False, "intel-amx-fault", "x")
    monkeypatch.setattr(engine_config, "kernel_choice", lambda width: amx_fault)
    one_token, _ = with_probed_kernels(EngineConfig(model_path=str(tiny_model), n_seq_max=1))
    assert one_token.repack == "auto"  # AMX's one-token layout for one slot is not the probe's call
    assert with_probed_kernels(EngineConfig(model_path=str(tiny_model), n_seq_max=8))[0].repack == "off"
    gpu, none = with_probed_kernels(EngineConfig(model_path=str(tiny_model), n_gpu_layers=-1))
    assert none is None and gpu.flash_attn == "auto"  # GPU layers: llama.cpp's own auto


def test_an_unwritable_home_keeps_the_defaults(
    fake_probe: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(again: bool, width: int) -> None:
        raise PermissionError(13, "Permission denied", "/models/probe/kernels.lock")

    monkeypatch.setattr(kernel_probe, "measure", read_only)
    assert kernel_probe.kernel_choice() is None  # the engine starts with the fixed kernels


def test_outpost_probe_measures_again_and_says_what_it_chose(
    fake_probe: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from outpost.cli import main

    assert main(["probe"]) == 0 and main(["probe"]) == 0
    assert len(fake_probe) == 1  # the second read the cache
    assert main(["probe", "--again"]) == 0 and len(fake_probe) == 2
    assert "auto kernels: amd-avx512: flash attention on" in capsys.readouterr().out
    monkeypatch.setattr(kernel_probe.os, "getloadavg", lambda: (64.0, 64.0, 64.0))
    assert main(["probe", "--again"]) == 1  # busy: not measured, and it says so
    assert "not measured" in capsys.readouterr().err
