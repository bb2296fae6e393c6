"""Pieces the benchmark scripts share: where the entry scripts are, stderr logging, the cached
synthetic models, a free port and waiting for a server to be ready, and making llama-cpp-python load
weights with the same layout Outpost uses."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from outpost.engine.config import EngineConfig
from outpost.engine.kernel_probe import machine_busy
from outpost.models import outpost_home, write_synthetic_model


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def bench_model(shape: str, quant: str) -> Path:
    """$OUTPOST_HOME/bench/SHAPE-QUANT.gguf, written once (seed 0) and reused."""
    path = outpost_home() / "bench" / f"{shape}-{quant}.gguf"
    if not path.exists():
        log(f"writing synthetic {shape} {quant} model to {path} ...")
        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_model(shape, path, quant=quant, seed=0)
    return path


def probe_kernels(parallel: int, quiet_wait_s: float = 120.0) -> str:
    """`outpost probe -np PARALLEL` before any server starts: servers started side by side would each
    find the machine busy with the others' loading and keep the fixed kernels. Where it did not
    answer and the machine is busy (a previous job winding down: the probe skips then), it is asked
    once more after waiting for a quiet machine, at most `quiet_wait_s`. Its answer, for the report."""
    answer = _probe_once(parallel)
    cpus = len(os.sched_getaffinity(0))
    if answer is None and machine_busy(os.getloadavg()[0], cpus):
        deadline = time.monotonic() + quiet_wait_s
        while machine_busy(load := os.getloadavg()[0], cpus) and time.monotonic() < deadline:
            log(f"kernel probe: waiting for a quiet machine (load {load:.1f} on {cpus} CPUs)")
            time.sleep(5)
        answer = _probe_once(parallel)
    answer = answer or "kernel probe: not measured (a busy machine or a failed probe)"
    line = f"{answer} (at {parallel} sequences)"
    log(line)
    return line


def _probe_once(parallel: int) -> str | None:
    """The probe's `auto kernels: ...` line, or None where it measured nothing."""
    cmd = [sys.executable, "-m", "outpost.cli", "probe", "-np", str(parallel)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    return next((ln for ln in out.stdout.splitlines() if ln.startswith("auto kernels:")), None)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            models = httpx.get(f"{url}/v1/models", timeout=2).status_code
            health = httpx.get(f"{url}/health", timeout=2).status_code  # 404 where there is none
            if models == 200 and health != 503:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{url} not ready in {timeout} s")


def same_weight_layout_for_llama_cpp_python(config: EngineConfig) -> None:
    """llama-cpp-python has no repack switch; set it through the defaults `Llama` reads, so every
    engine runs the same kernels as `config` (and on AMX CPUs the baseline avoids llama.cpp's AMX
    crash). The caller passes `config.effective_n_ubatch` as `Llama`'s n_ubatch."""
    import llama_cpp.llama_cpp as bindings  # the module `Llama` itself reads

    from outpost.engine.repack_overrides import RepackOverrides

    original = bindings.llama_model_default_params
    overrides = RepackOverrides(config.model_path) if config.use_repack_overrides else None

    def patched() -> Any:
        params = original()
        params.use_extra_bufts = config.use_extra_bufts
        if overrides is not None:
            overrides.apply(params)
        return params

    bindings.llama_model_default_params = patched


def weight_layout(model: Path, slots: int, n_gpu_layers: int = 0) -> str:
    """The layout Outpost picks for this model, slot count, CPU and GPU layers (outpost/engine/cpu_probe.py;
    -ngl 99 counts as every layer, as sizing resolves it)."""
    layers = -1 if n_gpu_layers >= 99 else n_gpu_layers
    return EngineConfig(model_path=str(model), n_seq_max=slots, n_gpu_layers=layers).weight_layout


def build_has_amx(binary: str | None) -> bool:
    """Whether the llama.cpp build `binary` belongs to has AMX kernels: the ggml_cpu_has_amx_int8()
    of the libggml-cpu beside it, asked in a child process (a second ggml must not load into this
    one). True where that cannot be read (a static build, no binary): the guess that never crashes."""
    if not binary:
        return True
    return _build_has_amx(str(Path(binary).resolve().parent))


@functools.cache
def _build_has_amx(folder: str) -> bool:
    lib = Path(folder) / "libggml-cpu.so"
    if not lib.exists():
        return True
    ask = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).ggml_cpu_has_amx_int8())"
    out = subprocess.run([sys.executable, "-c", ask, str(lib)], capture_output=True, text=True, check=False)
    return out.stdout.strip() != "0"


def baseline_layout(layout: str, binary: str | None) -> str:
    """The layout llama.cpp's own tool at `binary` runs for Outpost's `layout`. Where AMX tiles fault
    ("amx-gemv", "repacked-no-amx"), a build with AMX can run only plain weights beside Outpost's
    repacked ones (its -ot cannot name CPU_REPACK, and its repack picks AMX first: a crash on any
    batch), or AMX's one-token kernel; a build without AMX (build-llama-cpp.sh --no-amx) repacks to
    CPU_REPACK itself, Outpost's batching layout."""
    if layout in ("amx-gemv", "repacked-no-amx") and not build_has_amx(binary):
        return "repacked"
    return layout


def llama_bench_layout_args(layout: str) -> list[str]:
    """llama-bench flags for `layout` (see baseline_layout): extra buffer types, and one token per
    micro-batch where only AMX's one-token kernel is safe. "repacked-no-amx" gets the plain layout,
    the best a build with AMX can run where AMX tiles fault."""
    return {
        "plain": ["--repack", "0"],
        "repacked": ["--repack", "1"],
        "amx-gemv": ["--repack", "1", "-ub", "1"],
        "repacked-no-amx": ["--repack", "0"],
    }[layout]


def llama_server_layout_args(layout: str) -> list[str]:
    """llama-server's flags for `layout` (the same caveat as llama-bench's)."""
    return {
        "plain": ["--no-repack"],
        "repacked": [],
        "amx-gemv": ["-ub", "1"],
        "repacked-no-amx": ["--no-repack"],
    }[layout]
