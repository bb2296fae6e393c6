"""The CPU-build chooser: kernel feature bits -> build name, the override, and never a build the CPU lacks."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from outpost.engine import cpu_builds
from outpost.engine.cpu_builds import BUILDS, Choice, CpuBuildError, apply, available_builds, choose

ROOT = Path(__file__).resolve().parents[2]

# AT_HWCAP / AT_HWCAP2 bits as linux/arch/arm64/include/uapi/asm/hwcap.h numbers them.
FP, ASIMD, EVTSTRM, AES, PMULL, SHA1, SHA2, CRC32 = (1 << n for n in range(8))
ATOMICS, FPHP, ASIMDHP, CPUID, ASIMDRDM, JSCVT, FCMA, LRCPC = (1 << n for n in range(8, 16))
DCPOP, ASIMDDP, SVE, ASIMDFHM = 1 << 16, 1 << 20, 1 << 22, 1 << 23
HWCAP2_I8MM, HWCAP2_BF16 = 1 << 13, 1 << 14
# What the kernel reports on Neoverse N1 (Graviton2) and V1 (Graviton3), crypto included.
N1 = FP | ASIMD | EVTSTRM | AES | PMULL | SHA1 | SHA2 | CRC32 | ATOMICS | FPHP | ASIMDHP | CPUID
N1 |= ASIMDRDM | LRCPC | DCPOP | ASIMDDP
V1 = N1 | JSCVT | FCMA | ASIMDFHM | SVE
V1_HWCAP2 = HWCAP2_I8MM | HWCAP2_BF16
ARM = ["arm64-sve-i8mm", "arm64-n1"]
X86 = ["amd64-avx512", "amd64-v3"]


def cpuinfo(flags: str) -> str:
    return f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu sse sse2 {flags}\nbugs\t\t:\n"


V3_FLAGS = "avx avx2 fma f16c bmi1 bmi2 movbe"
SKYLAKE_X = f"{V3_FLAGS} avx512f avx512cd avx512dq avx512bw avx512vl"
SAPPHIRE_RAPIDS = f"{SKYLAKE_X} avx512_vnni avx512_bf16 amx_tile amx_int8"


def test_graviton2_gets_n1_and_is_told_why_not_sve() -> None:
    choice = choose(cpu_builds._hwcaps(N1, 0), ARM)
    assert choice.name == "arm64-n1"
    assert choice.describe().startswith("cpu build: arm64-n1 (the CPU has asimddp, asimdhp")
    assert "not arm64-sve-i8mm: no" in choice.why and "sve" in choice.why


def test_graviton3_gets_sve_i8mm() -> None:
    choice = choose(cpu_builds._hwcaps(V1, V1_HWCAP2), ARM)
    assert choice == Choice("arm64-sve-i8mm", "the CPU has sve, i8mm, bf16")


@pytest.mark.parametrize(
    ("hwcap", "hwcap2", "lacks"),
    [(V1, HWCAP2_BF16, "i8mm"), (V1 & ~SVE, V1_HWCAP2, "sve"), (V1 & ~JSCVT, V1_HWCAP2, "jscvt")],
)
def test_sve_build_needs_every_feature_it_was_compiled_for(hwcap: int, hwcap2: int, lacks: str) -> None:
    choice = choose(cpu_builds._hwcaps(hwcap, hwcap2), ARM)
    assert choice.name == "arm64-n1"
    assert f"not arm64-sve-i8mm: no {lacks}" in choice.why


def test_armv8_0_cpu_gets_no_build() -> None:  # Graviton1 / Cortex-A72: no dotprod, no fp16
    with pytest.raises(CpuBuildError, match=r"no installed llama.cpp build runs on this CPU.*asimddp"):
        choose(cpu_builds._hwcaps(FP | ASIMD | CRC32 | AES, 0), ARM)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [(SAPPHIRE_RAPIDS, "amd64-avx512"), (SKYLAKE_X, "amd64-v3"), (V3_FLAGS, "amd64-v3")],
)
def test_x86_flags_pick_the_build(flags: str, expected: str) -> None:
    assert choose(cpu_builds._x86_flags(cpuinfo(flags)), X86).name == expected


def test_x86_without_avx2_gets_no_build() -> None:
    with pytest.raises(CpuBuildError, match="not amd64-v3: no avx2"):
        choose(cpu_builds._x86_flags(cpuinfo("avx f16c")), X86)


def test_override_picks_a_supported_installed_build() -> None:
    features = cpu_builds._hwcaps(V1, V1_HWCAP2)
    assert choose(features, ARM, "arm64-n1") == Choice("arm64-n1", "OUTPOST_CPU_BUILD")


def test_override_never_picks_a_build_the_cpu_lacks() -> None:
    with pytest.raises(
        CpuBuildError, match=r"OUTPOST_CPU_BUILD=arm64-sve-i8mm: this CPU lacks .*sve.*SIGILL"
    ):
        choose(cpu_builds._hwcaps(N1, 0), ARM, "arm64-sve-i8mm")


def test_override_of_a_missing_build_names_the_installed_ones() -> None:
    with pytest.raises(
        CpuBuildError, match=r"OUTPOST_CPU_BUILD=amd64-v3: not installed here \(installed: arm64-n1\)"
    ):
        choose(cpu_builds._hwcaps(N1, 0), ["arm64-n1"], "amd64-v3")


def test_missing_best_build_falls_back_to_the_installed_one() -> None:
    assert choose(cpu_builds._hwcaps(V1, V1_HWCAP2), ["arm64-n1"]).name == "arm64-n1"


def test_random_feature_sets_never_get_an_unsupported_build() -> None:
    rng = random.Random(0)
    every = sorted({feature for needs in BUILDS.values() for feature in needs})
    for _ in range(2000):
        features = frozenset(f for f in every if rng.random() < 0.85)
        try:
            choice = choose(features, list(BUILDS))
        except CpuBuildError:
            assert all(set(needs) - features for needs in BUILDS.values())
            continue
        assert choice.name is not None and set(BUILDS[choice.name]) <= features


def make_builds(root: Path, *names: str) -> None:
    for name in names:
        (root / name).mkdir(parents=True)
        (root / name / "libllama.so").write_bytes(b"")


def test_available_builds_best_first_and_only_complete_known_ones(tmp_path: Path) -> None:
    make_builds(tmp_path, "amd64-v3", "arm64-n1", "amd64-avx512", "amd64-v4-someday")
    (tmp_path / "arm64-sve-i8mm").mkdir()  # no library: not installed
    assert available_builds(tmp_path) == ["arm64-n1", "amd64-avx512", "amd64-v3"]


def test_apply_points_the_bindings_at_a_build_this_cpu_runs(tmp_path: Path) -> None:
    make_builds(tmp_path, *BUILDS)
    env = {"OUTPOST_CPU_BUILDS_DIR": str(tmp_path)}
    try:
        choice = apply(env, modules={})
    except CpuBuildError:  # a CPU none of the builds runs on (not x86-64-v3 nor arm64 with dotprod)
        assert all(set(needs) - cpu_builds.cpu_features() for needs in BUILDS.values())
        return
    assert choice.name is not None and set(BUILDS[choice.name]) <= cpu_builds.cpu_features()
    assert env["LLAMA_CPP_LIB_PATH"] == str(tmp_path / choice.name) == str(choice.path)


def test_apply_leaves_a_callers_library_path_and_a_plain_install_alone(tmp_path: Path) -> None:
    make_builds(tmp_path, *BUILDS)
    env = {"OUTPOST_CPU_BUILDS_DIR": str(tmp_path), "LLAMA_CPP_LIB_PATH": "/x"}
    assert apply(env, modules={}) == Choice(None, "LLAMA_CPP_LIB_PATH=/x")
    env = {"OUTPOST_CPU_BUILDS_DIR": str(tmp_path / "none")}
    assert apply(env, modules={}).describe() == "cpu build: llama-cpp-python (its own build)"
    assert "LLAMA_CPP_LIB_PATH" not in env
    assert apply({}, modules={"llama_cpp.llama_cpp": object()}).name is None


def test_apply_with_an_override_and_no_builds_is_an_error(tmp_path: Path) -> None:
    env = {"OUTPOST_CPU_BUILDS_DIR": str(tmp_path), "OUTPOST_CPU_BUILD": "arm64-n1"}
    with pytest.raises(CpuBuildError, match="OUTPOST_CPU_BUILD=arm64-n1: no builds under"):
        apply(env, modules={})


def test_the_image_script_compiles_exactly_these_builds() -> None:
    script = (ROOT / "deploy" / "cpu-builds.sh").read_text()
    assert set(re.findall(r'"((?:amd64|arm64)-[a-z0-9-]+)\|', script)) == set(BUILDS)
    # Graviton2 must never get an instruction past armv8.2-a + dotprod + fp16.
    assert '"arm64-n1|-DGGML_CPU_ARM_ARCH=armv8.2-a+dotprod+fp16"' in script


# AT_HWCAP, AT_HWCAP2 as qemu-aarch64 7.2 (Debian 12) reports them to a static aarch64 program for
# QEMU_CPU=neoverse-n1, max (SVE, i8mm, bf16, SVE2...), cortex-a72 (armv8.0) and a64fx (SVE, no dotprod).
@pytest.mark.parametrize(
    ("qemu_cpu", "hwcap", "hwcap2", "expected"),
    [
        ("neoverse-n1", 0x119FFB, 0, "arm64-n1"),
        ("max", 0xECFFFFFB, 0x7F877FFF, "arm64-sve-i8mm"),
        ("cortex-a72", 0x8FB, 0, None),
        ("a64fx", 0x415FFB, 0, None),
    ],
)
def test_qemu_cpus_as_the_deploy_tier_runs_them(
    qemu_cpu: str, hwcap: int, hwcap2: int, expected: str | None
) -> None:
    features = cpu_builds._hwcaps(hwcap, hwcap2)
    if expected is None:
        with pytest.raises(CpuBuildError, match=r"not arm64-n1: no .*asimddp"):
            choose(features, ARM)
    else:
        assert choose(features, ARM).name == expected
