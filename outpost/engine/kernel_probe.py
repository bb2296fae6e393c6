"""Which flash attention, weight layout and KV layout decode fastest on this CPU: measured, cached.

Each of the three is a CPU question with no answer that holds everywhere. llama.cpp's CPU flash
attention halved decode at depth on the Intel VMs this project was built on, and is faster at every
depth on an AMD EPYC (llama-batched-bench -npp 128 -ntg 64 -npl 8 -t 2: 383 vs 320 tok/s); the
repacked weights are the fast layout on x86 and ARM alike except where a kernel is missing; a KV
stream per slot beats one pool where attention dominates a step, not where the weights do. So the
`auto` settings (`--flash-attn`, `--repack`, `--kv-unified`) are decided by a short measurement,
once per machine, like the AMX probe (cpu_probe.py): a child process loads the model in each
variant (the default and one setting changed at a time), decodes PROBE_SEQS sequences at depth
PROBE_DEPTH a few steps, and one sequence alone; the parent decides (`decide`, pure, tested with
made-up times for every CPU family) and caches the choice under $OUTPOST_HOME/probe, keyed by CPU
model, kernel and llama-cpp-python version. It runs only with OUTPOST_KERNEL_PROBE=on: two probes
on one shared AMD EPYC VM disagreed on flash attention (+20% / -19%), so until a benchmark shows it
choosing right, the default keeps the fixed choices (flash attention off, repacked weights, a
stream per slot) without measuring.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Literal

from outpost.engine.cpu_probe import _cpuinfo, _machine_key, _probe_dir, amx_tiles_work, cpu_has_amx

_log = logging.getLogger(__name__)

CpuFamily = Literal[
    "intel-amx-fault", "intel-amx", "intel-avx512", "intel-avx2", "amd-avx512", "amd-avx2", "arm", "other"
]
Layout = Literal["repacked", "plain"]
PROBE_ENV = "OUTPOST_KERNEL_PROBE"
PROBE_TIMEOUT_S = 600.0
PROBE_SEQS = 8  # the slots a server runs by default on 2 cores; batching is what the probe judges
PROBE_DEPTH = 96  # a chat turn's depth; deep enough that attention shows, short to prefill
PROBE_STEPS = 8
PROBE_ROUNDS = 3
# A changed setting must beat the default by this much (both scores are medians of rounds run in
# turn): closer than that is this machine's noise, and the default stays.
MARGIN = 0.04


@dataclass(frozen=True)
class Variant:
    """One way to run the model. `repacked` is the family's repacked layout: llama.cpp's own, or
    CPU_REPACK alone where AMX tiles fault (cpu_probe.choose_layout picks which)."""

    flash_attn: bool = False
    layout: Layout = "repacked"
    kv_unified: bool = False

    @property
    def name(self) -> str:
        fa = "fa on" if self.flash_attn else "fa off"
        kv = "one KV pool" if self.kv_unified else "KV per slot"
        return f"{fa}, {self.layout}, {kv}"


DEFAULT = Variant()
# One setting changed at a time: three variants more than the default, not seven.
TOGGLES: dict[str, Variant] = {
    "flash_attn": Variant(flash_attn=True),
    "layout": Variant(layout="plain"),
    "kv_unified": Variant(kv_unified=True),
}


@dataclass(frozen=True)
class Rates:
    """Aggregate decode tok/s of PROBE_SEQS sequences together and of one alone."""

    many: float
    one: float

    @property
    def score(self) -> float:
        """Geometric mean: a setting that speeds batches must not cost the lone request much."""
        if not (self.many > 0 and self.one > 0 and math.isfinite(self.many * self.one)):
            return 0.0
        return math.sqrt(self.many * self.one)


@dataclass(frozen=True)
class KernelChoice:
    """What `auto` means on this machine, and why (a phrase for the ready line)."""

    flash_attn: bool
    layout: Layout
    kv_unified: bool
    family: CpuFamily
    why: str

    def describe(self) -> str:
        fa = "on" if self.flash_attn else "off"
        kv = "one KV pool" if self.kv_unified else "a KV stream per slot"
        return f"{self.family}: flash attention {fa}, {self.layout} weights, {kv} ({self.why})"


def cpu_family(cpuinfo: str, machine: str, amx_works: bool | None) -> CpuFamily:
    """The CPU family from /proc/cpuinfo's text and the machine name; amx_works: the AMX probe's
    answer where the CPU advertises AMX (None: not probed)."""
    if machine.lower() in ("aarch64", "arm64") or "CPU implementer" in cpuinfo:
        return "arm"
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "").split()
    if "GenuineIntel" in cpuinfo:
        if "amx_int8" in flags:
            return "intel-amx" if amx_works else "intel-amx-fault"
        return "intel-avx512" if "avx512f" in flags else "intel-avx2"
    if "AuthenticAMD" in cpuinfo:
        return "amd-avx512" if "avx512f" in flags else "amd-avx2"
    return "other"


def decide(family: CpuFamily, measured: dict[str, Rates]) -> KernelChoice:
    """The choice from rates keyed "default" and by TOGGLES' names (missing: not measured, kept).

    Each setting is judged on its own against the default and kept where it scores MARGIN better.
    Family rules on top: where AMX tiles fault the "repacked" layout is CPU_REPACK alone (never
    llama.cpp's own list, which would pick AMX and crash), so it is measured like any other; on ARM
    the plain q4_0 layout has no repacked GEMM, and is only taken on a clear win (2 x MARGIN)."""
    base = measured.get("default")
    if base is None or base.score <= 0:
        return KernelChoice(False, "repacked", False, family, "not measured: the defaults")
    chosen = {"flash_attn": False, "layout": "repacked", "kv_unified": False}
    notes: list[str] = []
    for key, variant in TOGGLES.items():
        rates = measured.get(key)
        if rates is None:
            continue
        margin = 2 * MARGIN if family == "arm" and key == "layout" else MARGIN
        gain = rates.score / base.score - 1.0
        if gain > margin:
            chosen[key] = getattr(variant, key)
        notes.append(f"{_TOGGLE_NAMES[key]} {gain:+.0%}")
    layout: Layout = "plain" if chosen["layout"] == "plain" else "repacked"
    why = f"measured {base.many:.0f} tok/s x{PROBE_SEQS}, {base.one:.0f} x1 by default; " + ", ".join(notes)
    return KernelChoice(bool(chosen["flash_attn"]), layout, bool(chosen["kv_unified"]), family, why)


_TOGGLE_NAMES = {"flash_attn": "fa on", "layout": "plain weights", "kv_unified": "one KV pool"}


def this_cpu_family() -> CpuFamily:
    amx = amx_tiles_work() if cpu_has_amx() else None
    return cpu_family(_cpuinfo(), platform.machine(), amx)


def probe_enabled() -> bool:
    """Opt-in (OUTPOST_KERNEL_PROBE=on): two probes on one shared AMD EPYC VM disagreed on flash
    attention (+20% / -19%), so its choice is not yet better than the fixed defaults; see issue 25."""
    return os.environ.get(PROBE_ENV, "").strip().lower() in ("on", "1", "yes", "true")


@functools.cache
def kernel_choice(model_path: str) -> KernelChoice | None:
    """This machine's choice (None unless OUTPOST_KERNEL_PROBE=on): from the cache, or measured on
    `model_path` now (a few seconds for a 135M model) and cached. Once per process too."""
    if not probe_enabled():
        return None
    cache = _probe_dir() / "kernels.json"
    key = _machine_key()
    try:
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return KernelChoice(**saved["choice"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    family = this_cpu_family()
    started = time.perf_counter()
    measured = _run_probe(model_path, family)
    choice = decide(family, measured)
    _log.info("kernel probe (%.1f s on %s): %s", time.perf_counter() - started, model_path, choice.describe())
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    rates = {k: asdict(v) for k, v in measured.items()}
    tmp.write_text(json.dumps({"key": key, "choice": asdict(choice), "rates": rates, "model": model_path}))
    os.replace(tmp, cache)
    return choice


def _run_probe(model_path: str, family: CpuFamily) -> dict[str, Rates]:
    """The child's rates; {} when it fails or times out (then `decide` keeps the defaults)."""
    del family  # the child's layouts follow cpu_probe.choose_layout, which knows the family too
    shape = [str(n) for n in (PROBE_SEQS, PROBE_DEPTH, PROBE_STEPS, PROBE_ROUNDS)]
    cmd = [sys.executable, "-m", "outpost.engine.kernel_probe_child", model_path, *shape]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        _log.warning("kernel probe timed out; keeping the default kernels")
        return {}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        _log.warning("kernel probe failed (exit %s); keeping the default kernels", proc.returncode)
        return {}
    return {name: Rates(**rates) for name, rates in json.loads(lines[-1]).items()}
