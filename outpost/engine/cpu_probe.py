"""Which llama.cpp weight layout is safe and fast on this CPU: AMX probed once, in a child process.

On CPUs that advertise AMX, llama.cpp stores quantized weights in AMX's layout. Its one-token
matmul there is an AVX512-VNNI kernel, about 3x faster decode than the plain layout on this
project's 2-core VMs (1.7B q4_0: 24 vs 8 tok/s in llama-bench); its multi-token matmul uses AMX
tiles. Compiled by gcc 12 without -fno-dse, that matmul loads a tile configuration whose stores
the compiler deleted, and its first tile instruction kills the process (SIGILL or SIGSEGV; the
project's VMs showed it, llama.cpp PR #26954 names the cause). Outpost's own install compiles with
-fno-dse (scripts/install-llama-cpp.sh), but a llama-cpp-python built otherwise, or a hypervisor
that does not keep tile state, can still fault. A child process decodes a 4-token batch of a tiny
q8_0 model with that layout to find out safely; the answer is cached under $OUTPOST_HOME/probe,
keyed by CPU model, kernel, llama-cpp-python version and its libraries' size and date.

Layouts: "repacked" (llama.cpp's extra buffer types, its default), "plain" (none), "amx-gemv"
(AMX's layout, but one token per micro-batch so only the VNNI kernel ever runs: the fastest
decode for one or two sequences, but batching no longer pays), and "repacked-no-amx" (llama.cpp's
CPU_REPACK layout alone, named tensor by tensor, see repack_overrides.py: for more slots).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Literal

from outpost.home import outpost_home

_log = logging.getLogger(__name__)

WeightLayout = Literal["repacked", "plain", "amx-gemv", "repacked-no-amx"]
PROBE_TIMEOUT_S = 300.0


@functools.cache
def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_has_amx() -> bool:
    """True on Intel CPUs that advertise AMX tiles (Sapphire Rapids and later). x86-64 only: under
    qemu-user an arm64 process reads the x86 host's /proc/cpuinfo."""
    return platform.machine() in ("x86_64", "AMD64") and " amx_int8" in _cpuinfo()


def _machine_key() -> str:
    model = next((line for line in _cpuinfo().splitlines() if line.startswith("model name")), "")
    return (
        f"{model.split(':')[-1].strip()}|{os.uname().release}|llama-cpp-python {version('llama-cpp-python')}"
        f"|{library_identity()}"
    )


def _library_dir(env: Mapping[str, str] = os.environ) -> Path | None:
    """Where the bindings load llama.cpp's libraries from, found without importing them."""
    if env.get("LLAMA_CPP_LIB_PATH"):
        return Path(env["LLAMA_CPP_LIB_PATH"])
    spec = importlib.util.find_spec("llama_cpp")
    locations = spec.submodule_search_locations if spec else None
    return Path(next(iter(locations))) / "lib" if locations else None


def library_identity(env: Mapping[str, str] = os.environ) -> str:
    """Size and modification time of the CPU kernels' libraries: the same version compiled with
    other flags (scripts/llama-cpp-cmake-args: AMX tiles work or fault with them) is measured anew."""
    folder = _library_dir(env)
    try:
        files = sorted(folder.iterdir()) if folder else []
        found = [f for f in files if f.name.startswith(("libggml-cpu", "libllama"))]
        stats = [(f.name, f.stat()) for f in found if f.is_file() and not f.is_symlink()]
    except OSError:
        stats = []
    return ",".join(f"{name}:{st.st_size}:{st.st_mtime_ns}" for name, st in stats) or "libraries unknown"


def _probe_dir() -> Path:
    return outpost_home() / "probe"


@functools.cache
def amx_tiles_work() -> bool:
    """Can llama.cpp's AMX tile matmul run here? Cached on disk per machine, then per process."""
    cache = _probe_dir() / "amx.json"
    key = _machine_key()
    try:
        saved = json.loads(cache.read_text())
        if saved.get("key") == key:
            return bool(saved["tiles_work"])
    except (OSError, ValueError, KeyError):
        pass
    works = _run_probe()
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"key": key, "tiles_work": works}))
    os.replace(tmp, cache)
    return works


def write_probe_model(model: Path, shape: str = "tiny", quant: str = "q8_0") -> None:
    """A synthetic model for a probe, made by `outpost models synth` in a child process
    (outpost.models builds on the engine's quantizer, so the engine does not import it); written
    under a temporary name and renamed, so a probe never reads half a file."""
    tmp = model.with_suffix(f".{os.getpid()}.tmp")
    cmd = [sys.executable, "-m", "outpost.cli", "models", "synth", "--shape", shape, "--quant", quant]
    try:
        subprocess.run([*cmd, "--seed", "0", "-o", str(tmp)], capture_output=True, check=True, timeout=600)
        os.replace(tmp, model)
    finally:
        tmp.unlink(missing_ok=True)  # a failed or timed-out write leaves nothing behind


def _run_probe() -> bool:
    model = _probe_dir() / "tiny-q8_0.gguf"
    if not model.is_file():
        write_probe_model(model)
    cmd = [sys.executable, "-m", "outpost.engine.amx_child", str(model)]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        _log.warning("AMX probe timed out; using the plain weight layout")
        return False
    if proc.returncode != 0:
        _log.info("AMX tiles fault here (probe exit %s): one token per micro-batch", proc.returncode)
    return proc.returncode == 0


# Slots up to which AMX's one-token mode is the better choice. Each token is its own micro-batch,
# so the weights are read once per sequence per step and batching stops paying: the two layouts
# were even at 2 slots under full load, and one-token much faster whenever one request runs
# (docs/performance.md, "Figures behind the code's constants").
ONE_TOKEN_MAX_SLOTS = 2


def choose_layout(
    repack: Literal["auto", "on", "off"], n_slots: int = 1, gpu_layers: int = 0
) -> WeightLayout:
    """auto: llama.cpp's default, unless its AMX tiles fault here: then AMX's one-token kernel for
    up to ONE_TOKEN_MAX_SLOTS slots (latency), the repacked layout without AMX for more (batched
    throughput).

    With layers on a GPU (`gpu_layers` > 0; < 0: all of them) the layouts only concern the layers
    left on the CPU. All offloaded: none is, so auto is the plain layout and the AMX probe never
    runs. Some offloaded: the one-token mode is out (a micro-batch of one token would make every
    GPU layer take prompts a token at a time) and so are the per-tensor overrides (they would pin
    offloaded weights to the CPU), so where tiles fault the CPU's layers get the plain layout."""
    if repack == "off" or (repack == "auto" and gpu_layers < 0):
        return "plain"
    if repack == "on" or not cpu_has_amx() or amx_tiles_work():
        return "repacked"
    if gpu_layers > 0:
        return "plain"
    return "amx-gemv" if n_slots <= ONE_TOKEN_MAX_SLOTS else "repacked-no-amx"
