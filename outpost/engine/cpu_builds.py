"""Which of several llama.cpp CPU builds this process loads: chosen from the CPU's features at start.

An image (deploy/cpu-builds.sh) ships complete llama.cpp builds under `<venv>/cpu-builds/<name>/`,
each compiled for one instruction set: `arm64-n1` (Graviton2), `arm64-sve-i8mm` (Graviton3/4),
`amd64-v3` and `amd64-avx512`. Only ggml's CPU kernels differ between them. Before `llama_cpp` is
first imported (outpost/engine/lib.py), `apply()` picks the fastest build whose instructions the CPU
has and points llama-cpp-python at it through LLAMA_CPP_LIB_PATH, which its bindings read at import.

Features come from the kernel: getauxval(AT_HWCAP/AT_HWCAP2) on arm64 (under qemu-user these are the
emulated CPU's; /proc/cpuinfo would be the host's) and /proc/cpuinfo's flags on x86-64 (CPUID, less
what the OS does not save, such as AVX-512 state). A build the CPU lacks an instruction of is never
picked, not even when OUTPOST_CPU_BUILD names it: that would die with SIGILL mid-request.
"""

from __future__ import annotations

import ctypes
import functools
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "BUILDS",
    "Choice",
    "CpuBuildError",
    "apply",
    "available_builds",
    "choose",
    "cpu_features",
]

# linux/arch/arm64/include/uapi/asm/hwcap.h: AT_HWCAP bits, and AT_HWCAP2 bits (as "hwcap2:<name>").
_HWCAP = {
    "fp": 0, "asimd": 1, "crc32": 7, "atomics": 8, "fphp": 9, "asimdhp": 10, "asimdrdm": 12,
    "jscvt": 13, "fcma": 14, "lrcpc": 15, "dcpop": 16, "asimddp": 20, "sve": 22, "asimdfhm": 23,
}  # fmt: skip
_HWCAP2 = {"i8mm": 13, "bf16": 14}
_AT_HWCAP, _AT_HWCAP2 = 16, 26

# What each build's compiler flags let it execute (deploy/cpu-builds.sh has the flags), best first
# per architecture. armv8.2-a brings LSE atomics, RDM and CRC32; armv8.4-a adds RCpc, JSCVT, FCMA,
# DC CVAP and FHM: the baseline instructions gcc may emit for those -march values, plus the options.
_ARMV82 = ("fp", "asimd", "crc32", "atomics", "asimdrdm", "fphp", "asimdhp", "asimddp")
_ARMV84 = (*_ARMV82, "lrcpc", "jscvt", "fcma", "dcpop", "asimdfhm")
_X86_V3 = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2")
BUILDS: dict[str, tuple[str, ...]] = {
    "arm64-sve-i8mm": (*_ARMV84, "sve", "i8mm", "bf16"),
    "arm64-n1": _ARMV82,
    "amd64-avx512": (
        *_X86_V3, "avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw", "avx512_vnni", "avx512_bf16",
    ),
    "amd64-v3": _X86_V3,
}  # fmt: skip
# The features that tell a build from the next one down, for the ready line's "why".
_SHOWN = {
    "arm64-sve-i8mm": ("sve", "i8mm", "bf16"),
    "arm64-n1": ("asimddp", "asimdhp"),
    "amd64-avx512": ("avx512f", "avx512_vnni", "avx512_bf16"),
    "amd64-v3": ("avx2", "fma"),
}


class CpuBuildError(RuntimeError):
    """No installed build runs on this CPU, or OUTPOST_CPU_BUILD names one that is absent or unsafe."""


@dataclass(frozen=True)
class Choice:
    """The build loaded (None: llama-cpp-python's own libraries) and why, for the ready line."""

    name: str | None
    why: str
    path: Path | None = None

    def describe(self) -> str:
        return f"cpu build: {self.name or 'llama-cpp-python'} ({self.why})"


def _hwcaps(hwcap: int, hwcap2: int) -> frozenset[str]:
    names = {name for name, bit in _HWCAP.items() if hwcap >> bit & 1}
    return frozenset(names | {name for name, bit in _HWCAP2.items() if hwcap2 >> bit & 1})


def _x86_flags(cpuinfo: str) -> frozenset[str]:
    line = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    return frozenset(line.partition(":")[2].split())


@functools.cache
def cpu_features() -> frozenset[str]:
    """The instruction-set features this process may use (empty on other architectures)."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        return _hwcaps(int(getauxval(_AT_HWCAP)), int(getauxval(_AT_HWCAP2)))
    if machine in ("x86_64", "amd64"):
        try:
            return _x86_flags(Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace"))
        except OSError:
            return frozenset()
    return frozenset()


def available_builds(root: Path) -> list[str]:
    """The known builds installed under `root` (a folder per build holding libllama.so)."""
    return [name for name in BUILDS if (root / name / "libllama.so").is_file()]


def _missing(name: str, features: frozenset[str]) -> list[str]:
    return [feature for feature in BUILDS[name] if feature not in features]


def choose(features: frozenset[str], available: list[str], override: str | None = None) -> Choice:
    """The best of `available` that `features` can run, or `override` if it can; never one it cannot."""
    if override:
        if override not in available:
            raise CpuBuildError(
                f"OUTPOST_CPU_BUILD={override}: not installed here"
                f" (installed: {', '.join(available) or 'none'})"
            )
        lacks = _missing(override, features)
        if lacks:
            raise CpuBuildError(
                f"OUTPOST_CPU_BUILD={override}: this CPU lacks {', '.join(lacks)}; it would die with SIGILL"
            )
        return Choice(override, "OUTPOST_CPU_BUILD")
    passed: list[str] = []
    for name in available:  # BUILDS' order: best first
        lacks = _missing(name, features)
        if not lacks:
            why = f"the CPU has {', '.join(_SHOWN[name])}"
            if passed:
                why += "; " + "; ".join(passed)
            return Choice(name, why)
        passed.append(f"not {name}: no {', '.join(lacks)}")
    raise CpuBuildError(
        f"no installed llama.cpp build runs on this CPU ({'; '.join(passed) or 'none installed'})"
    )


def builds_root(env: Mapping[str, str]) -> Path:
    """Where builds are installed: $OUTPOST_CPU_BUILDS_DIR, else `<venv>/cpu-builds` (/opt/outpost/...)."""
    return Path(env.get("OUTPOST_CPU_BUILDS_DIR") or Path(sys.prefix) / "cpu-builds")


def apply(env: MutableMapping[str, str] = os.environ, modules: Mapping[str, object] = sys.modules) -> Choice:
    """Choose a build and set LLAMA_CPP_LIB_PATH to it in `env`; before `llama_cpp` is imported.

    Nothing is chosen where LLAMA_CPP_LIB_PATH is set already (the caller's) or no builds are installed
    (a pip install: llama-cpp-python's own libraries, compiled for this machine)."""
    if "llama_cpp.llama_cpp" in modules:
        return Choice(None, "llama_cpp was imported before the choice")
    if env.get("LLAMA_CPP_LIB_PATH"):
        return Choice(None, f"LLAMA_CPP_LIB_PATH={env['LLAMA_CPP_LIB_PATH']}")
    root = builds_root(env)
    available = available_builds(root)
    if not available:
        if env.get("OUTPOST_CPU_BUILD"):
            raise CpuBuildError(f"OUTPOST_CPU_BUILD={env['OUTPOST_CPU_BUILD']}: no builds under {root}")
        return Choice(None, "its own build")
    choice = choose(cpu_features(), available, env.get("OUTPOST_CPU_BUILD") or None)
    path = root / str(choice.name)
    env["LLAMA_CPP_LIB_PATH"] = str(path)
    return Choice(choice.name, choice.why, path)
