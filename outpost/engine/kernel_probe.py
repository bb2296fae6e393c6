"""Which flash attention, weight layout and KV layout decode fastest on this CPU: measured, cached.

Each of the three is a CPU question with no answer that holds everywhere. llama.cpp's CPU flash
attention halved decode at depth on the Intel VMs this project was built on, and is faster at every
depth on an AMD EPYC (docs/performance.md, "Figures behind the code's constants"); the repacked
weights are the fast layout on x86 and ARM alike except where a kernel is missing; a KV stream per
slot beats one pool where attention dominates a step, not where the weights do. So the `auto`
settings (`--flash-attn`, `--repack`, `--kv-unified`) are decided by a short measurement, once per
machine, like the AMX probe (cpu_probe.py): a child process loads a fixed probe model
(SmolLM2-135M-shaped, q4_0, synthetic: the same question on every machine, and four copies of it fit
anywhere, which four copies of a served 20B model would not) in each variant (the default and one
setting changed at a time), decodes as many sequences as the server has slots at depth PROBE_DEPTH a
few steps, and one sequence alone, round after round; the parent decides (`decide`, pure, tested
with made-up rates for every CPU family) and caches the choice under $OUTPOST_HOME/probe, keyed by
CPU model, kernel and llama-cpp-python version. The batch is the server's own width: the slots it
runs (`-np`, at most MAX_PROBE_WIDTH), each width measured and cached on its own, since the answer
changes with it (llama-batched-bench on a Zen 3: flash attention as fast or faster off at 4 and 8
sequences, 11% slower off at 16: docs/performance.md, the 16-stream section).

Two probes on one shared, loaded AMD EPYC VM once disagreed on flash attention (+20% / -19%), so a
setting is only changed when it wins every round against the default (paired: the rounds run in
turn) as well as by MARGIN in the median, and a machine busier than its cores (load average) is not
probed at all: it keeps the fixed defaults (flash attention off, repacked weights, a stream per
slot) until a later start finds it quiet. OUTPOST_KERNEL_PROBE=off turns the probe off (the tests
do: their results must not follow the machine's speed).
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from outpost.engine.cpu_probe import (
    _cpuinfo,
    _machine_key,
    _probe_dir,
    amx_tiles_work,
    cpu_has_amx,
    write_probe_model,
)

_log = logging.getLogger(__name__)

CpuFamily = Literal[
    "intel-amx-fault", "intel-amx", "intel-avx512", "intel-avx2", "amd-avx512", "amd-avx2", "arm", "other"
]
Layout = Literal["repacked", "plain"]
PROBE_ENV = "OUTPOST_KERNEL_PROBE"
PROBE_TIMEOUT_S = 600.0
PROBE_SEQS = 8  # `outpost probe`'s width when none is given (sizing gives 2 cores 8 slots)
# Wider servers are judged at this many sequences: the probe's time grows with the width (its
# prefill is width x PROBE_DEPTH tokens per variant; 21 s at 4 and 37-47 s at 16 on 2 Zen 3 cores).
MAX_PROBE_WIDTH = 32
PROBE_DEPTH = 96  # a chat turn's depth; deep enough that attention shows, short to prefill
PROBE_STEPS = 8
PROBE_ROUNDS = 3
PROBE_SHAPE = "smollm2-135m"  # outpost.models' synthetic shape the probe model has
PROBE_VERSION = 3  # in the cache key: a choice made by an older probe is measured again
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


def _geomean(many: float, one: float) -> float:
    """A setting that speeds batches must not cost the lone request much."""
    if not (many > 0 and one > 0 and math.isfinite(many * one)):
        return 0.0
    return math.sqrt(many * one)


@dataclass(frozen=True)
class Rates:
    """Aggregate decode tok/s of the probe's width of sequences together and of one alone (medians of the
    rounds), and each round's score, in round order (empty: not known)."""

    many: float
    one: float
    rounds: tuple[float, ...] = ()

    @classmethod
    def from_rounds(cls, many: list[float], one: list[float]) -> Rates:
        scores = tuple(_geomean(m, o) for m, o in zip(many, one, strict=True))
        return cls(statistics.median(many), statistics.median(one), scores)

    @property
    def score(self) -> float:
        return _geomean(self.many, self.one)

    def wins_every_round(self, base: Rates) -> bool:
        """True where the rounds are unknown (nothing to pair) or this beat `base` in each."""
        if not self.rounds or len(self.rounds) != len(base.rounds):
            return True
        return all(mine > theirs for mine, theirs in zip(self.rounds, base.rounds, strict=True))


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


def probe_width(n_slots: int) -> int:
    """The width a server of `n_slots` slots is probed at."""
    return min(max(n_slots, 1), MAX_PROBE_WIDTH)


def decide(family: CpuFamily, measured: dict[str, Rates], width: int = PROBE_SEQS) -> KernelChoice:
    """The choice from rates keyed "default" and by TOGGLES' names (missing: not measured, kept).

    Each setting is judged on its own against the default and taken where its median scores MARGIN
    better and it won every round (a load that moved during the probe loses a round).
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
        steady = rates.wins_every_round(base)
        if gain > margin and steady:
            chosen[key] = getattr(variant, key)
        notes.append(
            f"{_TOGGLE_NAMES[key]} {gain:+.0%}" + ("" if steady or gain <= 0 else " (not every round)")
        )
    layout: Layout = "plain" if chosen["layout"] == "plain" else "repacked"
    why = f"measured {base.many:.0f} tok/s x{width}, {base.one:.0f} x1 by default; " + ", ".join(notes)
    return KernelChoice(bool(chosen["flash_attn"]), layout, bool(chosen["kv_unified"]), family, why)


_TOGGLE_NAMES = {"flash_attn": "fa on", "layout": "plain weights", "kv_unified": "one KV pool"}


def this_cpu_family() -> CpuFamily:
    amx = amx_tiles_work() if cpu_has_amx() else None
    return cpu_family(_cpuinfo(), platform.machine(), amx)


def probe_enabled() -> bool:
    """On unless OUTPOST_KERNEL_PROBE is off (0, no, false)."""
    return os.environ.get(PROBE_ENV, "").strip().lower() not in ("off", "0", "no", "false")


def machine_busy(load_1min: float, cpus: int) -> bool:
    """More runnable work than cores: a probe would measure the load, not the kernels."""
    return load_1min >= max(1, cpus)


@functools.cache
def kernel_choice(width: int = PROBE_SEQS) -> KernelChoice | None:
    """This machine's choice for `width` sequences (probe_width of the server's slots): from the
    cache, or measured now (~20-40 s on 2 cores, once per machine and width) and cached. None
    with the probe off, or on a busy machine (the next start tries again). Processes starting
    together (workers on one box) probe once: the others wait for its answer."""
    if not probe_enabled():
        return None
    try:
        return measure(again=False, width=width)
    except OSError as err:  # a read-only $OUTPOST_HOME: the fixed kernels, not a failed start
        _log.warning("kernel probe: %s; the default kernels this run", err)
        return None


def measure(again: bool, width: int = PROBE_SEQS) -> KernelChoice | None:
    """The cached choice for `width`, or (`again`: always) a new measurement, cached; under the
    probe's lock."""
    width = probe_width(width)
    cache = _probe_dir() / f"kernels-w{width}.json"
    key = f"{_machine_key()}|kernel probe v{PROBE_VERSION}|width {width}"
    cache.parent.mkdir(parents=True, exist_ok=True)
    with (_probe_dir() / "kernels.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = None if again else _cached(cache, key)
        if cached is not None:
            return cached
        load, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
        if machine_busy(load, cpus):
            _log.warning("kernel probe skipped: load %.1f on %d CPUs; default kernels this run", load, cpus)
            return None
        # Shown at the default log level: a first start otherwise sits silent for ~25 s.
        _log.warning(
            "measuring this machine's kernels, once (~25 s on 2 cores; OUTPOST_KERNEL_PROBE=off skips)"
        )
        started = time.perf_counter()
        model = _probe_model()
        measured = _run_probe(str(model), width) if model is not None else {}
        if not measured:
            return None  # a failed probe is not an answer: keep the defaults, not cached
        choice = decide(this_cpu_family(), measured, width)
        _log.info("kernel probe (%.1f s): %s", time.perf_counter() - started, choice.describe())
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        rates = {k: asdict(v) for k, v in measured.items()}
        saved = {"key": key, "choice": asdict(choice), "rates": rates, "model": str(model)}
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, cache)
        return choice


def _cached(cache: Path, key: str) -> KernelChoice | None:
    try:
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return KernelChoice(**saved["choice"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _probe_model() -> Path | None:
    """The probe's model, written once (cpu_probe.write_probe_model)."""
    model = _probe_dir() / f"{PROBE_SHAPE}-q4_0.gguf"
    if model.is_file():
        return model
    model.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_probe_model(model, PROBE_SHAPE, "q4_0")
    except (subprocess.SubprocessError, OSError) as err:
        _log.warning("kernel probe: could not write its model (%s); keeping the default kernels", err)
        return None
    return model


def _run_probe(model_path: str, width: int) -> dict[str, Rates]:
    """The child's rates at `width` sequences; {} when it fails or times out (then `decide`
    keeps the defaults)."""
    shape = [str(n) for n in (width, PROBE_DEPTH, PROBE_STEPS, PROBE_ROUNDS)]
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
    return {name: Rates.from_rounds(r["many"], r["one"]) for name, r in json.loads(lines[-1]).items()}
