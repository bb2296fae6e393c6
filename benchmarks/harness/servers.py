"""The servers benchmarks/serve/ compares, as processes: `outpost serve`, llama.cpp's `llama-server`
and llama-cpp-python's server, each with the same GGUF, threads, slots and KV cells, on a free
loopback port, optionally pinned to CPUs (`taskset -c`), stderr logged to a file.

Not run by hand, except as llama-cpp-python's server worker (serve.py starts it so):
    python -m benchmarks.harness.servers --llama-cpp-python-server --model M.gguf --n_threads 2 ...
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from benchmarks.harness.common import (
    baseline_layout,
    llama_server_layout_args,
    log,
    same_weight_layout_for_llama_cpp_python,
    wait_ready,
    weight_layout,
)
from benchmarks.harness.ports import free_port
from outpost.engine.config import EngineConfig

LCP_WORKER = "--llama-cpp-python-server"
KINDS = ("outpost", "llama_server", "llama_cpp_python")
LABELS = {"outpost": "outpost", "llama_server": "llama-server", "llama_cpp_python": "llama-cpp-python"}
LCP_SLOTS = 4  # the layout llama-cpp-python's server loads (see run_llama_cpp_python_server)
CACHE_REUSE = ["--cache-reuse", "256"]  # llama-server's prompt-cache chunk reuse, as its docs suggest


@dataclass(frozen=True)
class Setup:
    """What every server gets alike."""

    model: Path
    threads: int
    parallel: int
    cpus: str | None  # `taskset -c` list, or None: not pinned
    llama_server: str | None  # the llama-server binary
    n_gpu_layers: int = 0  # -ngl for outpost and llama-server alike (0: the CPU)

    @property
    def ctx(self) -> int:
        return 1024 * self.parallel  # KV cells for all slots: 1024 positions per slot


@dataclass(frozen=True)
class ServerSpec:
    """One server's command line and the weight layout it runs, recorded in results.json."""

    kind: str
    argv: list[str]
    layout: str
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "command": shlex.join(self.argv),
            "layout": self.layout,
            "notes": self.notes,
        }


def eog_tokens(model: Path) -> list[int]:
    """Every end-of-generation id: the workload bans them all so each stream runs to max_tokens."""
    from outpost.engine.model import LoadedModel

    loaded = LoadedModel(EngineConfig(model_path=str(model), n_ctx=256, n_seq_max=1))
    try:
        return sorted(loaded.vocab.eog_ids)
    finally:
        loaded.close()


def server_spec(kind: str, setup: Setup, port: int, prompt_cache: bool = False) -> ServerSpec:
    """`kind`'s command line; `prompt_cache`: llama-server with `--cache-reuse` (its users' setting for
    shared prefixes; Outpost's prefix cache is on by default)."""
    m, t, p, np_, ctx = str(setup.model), str(setup.threads), str(port), str(setup.parallel), str(setup.ctx)
    pin = ["taskset", "-c", setup.cpus] if setup.cpus else []
    if kind == "outpost":
        argv = [
            sys.executable,
            "-m",
            "outpost.cli",
            "serve",
            "-m",
            m,
            "-t",
            t,
            "-np",
            np_,
            "-c",
            ctx,
            "--port",
            p,
        ]
        if setup.n_gpu_layers:
            argv += ["-ngl", str(setup.n_gpu_layers)]
        layout = weight_layout(setup.model, setup.parallel, setup.n_gpu_layers)
        return ServerSpec(kind, pin + argv, layout, ["chosen by outpost itself (--repack auto)"])
    if kind == "llama_cpp_python":
        opts = f"--model {m} --n_threads {t} --n_threads_batch {t} --n_ctx 2048 --host 127.0.0.1 --port {p}"
        argv = [
            sys.executable,
            "-m",
            "benchmarks.harness.servers",
            LCP_WORKER,
            *opts.split(),
            "--verbose",
            "False",
        ]
        layout = weight_layout(setup.model, LCP_SLOTS)
        return ServerSpec(
            kind, pin + argv, layout, ["one request at a time (no -np); Outpost's layout for 4 slots"]
        )
    assert kind == "llama_server" and setup.llama_server
    if setup.n_gpu_layers:
        return _llama_server_on_gpu(setup, port, prompt_cache, pin)
    ours = weight_layout(setup.model, setup.parallel)
    theirs = baseline_layout(ours, setup.llama_server)
    layout_args = llama_server_layout_args(theirs)
    opts = f"-m {m} -t {t} -tb {t} -np {np_} -c {ctx} --host 127.0.0.1 --port {p}"
    argv = [setup.llama_server, *opts.split(), *layout_args, *(CACHE_REUSE if prompt_cache else [])]
    notes = [f"layout flags {layout_args or '(none: its default repack)'} for Outpost's {ours!r} layout"]
    if "--no-repack" in layout_args:
        ran, why = (
            "plain",
            "--no-repack: llama-server's own repack picks AMX, whose tiles fault on this CPU (crash)",
        )
    elif theirs != ours:  # the kernels Outpost's overrides name, reached by the build's own repack
        ran, why = (
            "repacked-no-amx",
            "a llama.cpp build without AMX: its own repack takes CPU_REPACK, Outpost's layout",
        )
    else:
        ran, why = ours, ""
    return ServerSpec(kind, pin + argv, ran, [*notes, why] if why else notes)


def _llama_server_on_gpu(setup: Setup, port: int, prompt_cache: bool, pin: list[str]) -> ServerSpec:
    """llama-server with layers on a GPU: Outpost's flags and its own defaults otherwise (its CPU
    layout flags concern the CPU's weights; `-fit off`: it keeps the -c and -ngl given instead of
    refitting them to the free memory)."""
    assert setup.llama_server
    opts = f"-m {setup.model} -t {setup.threads} -tb {setup.threads} -np {setup.parallel} -c {setup.ctx}"
    opts += f" -ngl {setup.n_gpu_layers} -fit off --host 127.0.0.1 --port {port}"
    argv = [setup.llama_server, *opts.split(), *(CACHE_REUSE if prompt_cache else [])]
    layout = weight_layout(setup.model, setup.parallel, setup.n_gpu_layers)
    return ServerSpec(
        "llama_server", pin + argv, layout, ["-ngl: its default CPU layout for what stays there"]
    )


class ServerProcess:
    """One server under test: started and waited for on enter, stopped (SIGTERM, then kill) on exit.
    Its stdout and stderr go to `log_path`."""

    def __init__(self, spec: ServerSpec, port: int, log_path: Path, ready_timeout: float = 300.0) -> None:
        self.spec, self.url, self.log_path = spec, f"http://127.0.0.1:{port}", log_path
        self.ready_timeout = ready_timeout
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, kind: str, setup: Setup, log_path: Path, prompt_cache: bool = False) -> ServerProcess:
        port = free_port()
        return cls(server_spec(kind, setup, port, prompt_cache), port, log_path)

    def __enter__(self) -> ServerProcess:
        log(f"[{self.spec.label}] $ {shlex.join(self.spec.argv)}")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(self.spec.argv, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_ready(self.url, self.proc, self.ready_timeout)
        except BaseException:
            self.__exit__()
            log(f"[{self.spec.label}] did not start; last lines of {self.log_path}:\n{self.log_tail()}")
            raise
        log(f"[{self.spec.label}] ready on {self.url}")
        return self

    def exited(self) -> int | None:
        """The exit status if the server is no longer running (a crash mid-run), else None."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 12) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None


def run_llama_cpp_python_server(argv: list[str]) -> None:
    """`python -m llama_cpp.server ARGV` with the weight layout Outpost picks for several slots
    (outpost/engine/cpu_probe.py). Not the one-token AMX layout, though it serves one request at a
    time: it loads the model on one thread and decodes on another, and on this VM that makes
    OpenMP decode ~3x slower after AMX repacking (13 vs 39 tok/s measured)."""
    import runpy

    config = EngineConfig(model_path=argv[argv.index("--model") + 1], n_seq_max=LCP_SLOTS)
    same_weight_layout_for_llama_cpp_python(config)
    sys.argv = ["llama_cpp.server", *argv, "--n_ubatch", str(config.effective_n_ubatch)]
    runpy.run_module("llama_cpp.server", run_name="__main__")


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == LCP_WORKER:
    run_llama_cpp_python_server(sys.argv[2:])
