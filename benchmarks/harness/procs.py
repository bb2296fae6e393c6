"""The processes `python -m benchmarks.cluster` runs: a RabbitMQ broker (scripts/broker.sh on free
ports), `outpost gateway` / `outpost worker` / `outpost serve` and the fake workers
(benchmarks/cluster/fake_worker.py), each optionally pinned to CPUs with `taskset -c`, its stderr in a
log file; plus what is read from them while they run (live workers on /health, `outpost_cluster_*`
counters on /metrics, CPU time).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import httpx

from benchmarks.harness.broker import Broker
from benchmarks.harness.common import wait_ready
from benchmarks.harness.ports import free_port

OUTPOST = [sys.executable, "-m", "outpost.cli"]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def pin(cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


@contextmanager
def pinned(cpus: str | None) -> Iterator[None]:
    """This process (the load generator) on `cpus` for the block; None: left as it is."""
    before = os.sched_getaffinity(0)
    if cpus:
        os.sched_setaffinity(0, cpu_set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpu_set(cpus: str) -> set[int]:
    """The CPUs a `taskset -c` list names ("1", "0-3,6")."""
    out: set[int] = set()
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@contextmanager
def running_broker(
    logs: Path, cpus: str | None = None, nodes: int = 1, listen: tuple[str, ...] = ()
) -> Iterator[Broker]:
    """scripts/broker.sh (broker.py) on free loopback ports in a temp folder, optionally pinned, with
    `nodes` nodes listening on `listen` too. On exit: stopped, its logs copied to `logs`/broker-PORT,
    the folder removed."""
    folder = Path(tempfile.mkdtemp(prefix="outpost-bench-broker-"))
    broker = Broker(folder, nodes=nodes, listen=listen, prefix=pin(cpus))
    try:
        broker.start()
        yield broker
    finally:
        with contextlib.suppress(RuntimeError, subprocess.SubprocessError):
            broker.stop()
        with contextlib.suppress(OSError):
            shutil.copytree(folder / "log", logs / f"broker-{broker.amqp_port}", dirs_exist_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


_serial = itertools.count()


class Process:
    """A command, optionally pinned with taskset (which execs it: same pid); its stderr in `logs`.
    Stopped on exit: SIGTERM, then SIGKILL after `grace` s."""

    def __init__(self, name: str, argv: list[str], cpus: str | None, logs: Path, grace: float = 60.0) -> None:
        self.name = name
        self.grace = grace
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"{next(_serial):03d}-{name.replace('/', '_')}.log"
        self._log: IO[bytes] = self.log_path.open("wb")
        self.proc = subprocess.Popen([*pin(cpus), *argv], stdout=subprocess.DEVNULL, stderr=self._log)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def check(self) -> None:
        if not self.alive():
            raise RuntimeError(f"{self.name} exited {self.proc.returncode}:\n{self.stderr_tail()}")

    def kill(self) -> None:
        """SIGKILL, as a crash: no drain."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def engine_args(model: Path, threads: int, slots: int, ctx: int | None = None) -> list[str]:
    """serve's and the worker's engine flags: by default 1024 KV cells per slot."""
    return ["-m", str(model), "-t", str(threads), "-np", str(slots), "-c", str(ctx or 1024 * slots)]


def serve(model: Path, engine: list[str], cpus: str | None, logs: Path) -> tuple[Process, str]:
    """`outpost serve` with `engine` flags, ready; the caller closes the Process."""
    port = free_port()
    proc = Process("serve", [*OUTPOST, "serve", *engine, "--port", str(port)], cpus, logs)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc.proc)
    except (RuntimeError, TimeoutError) as exc:
        proc.__exit__()
        raise RuntimeError(f"serve not ready: {exc}\n{proc.stderr_tail()}") from exc
    return proc, url


def worker(
    broker: Broker, engine: list[str], cpus: str | None, logs: Path, worker_id: str | None = None
) -> Process:
    ident = ["--worker-id", worker_id] if worker_id else []
    name = f"worker-{worker_id or 'anon'}@{cpus or 'all'}"
    return Process(name, [*OUTPOST, "worker", *broker.flags(), *engine, *ident], cpus, logs)


def fake_worker(
    broker: Broker, model_id: str, slots: int, interval: float, cpus: str | None, logs: Path, worker_id: str
) -> Process:
    """benchmarks/cluster/fake_worker.py: the real Worker over an engine with no model."""
    argv = [sys.executable, "-m", "benchmarks.cluster.fake_worker", *broker.flags(), "--model-id", model_id]
    argv += ["--slots", str(slots), "--token-interval", str(interval), "--worker-id", worker_id]
    return Process(f"fake-{worker_id}@{cpus or 'all'}", argv, cpus, logs, grace=15.0)


@contextmanager
def gateway(
    broker: Broker,
    model: Path,
    logs: Path,
    max_queue: int = 1024,
    cpus: str | None = None,
    prefix_routing: str | None = None,
) -> Iterator[tuple[str, Process]]:
    """A ready `outpost gateway`: its URL and process."""
    port = free_port()
    args = [*OUTPOST, "gateway", *broker.flags(), "--broker-management-url", broker.mgmt_url]
    args += ["-m", str(model), "--port", str(port), "--max-queue", str(max_queue)]
    if prefix_routing:
        args += ["--prefix-routing", prefix_routing]
    url = f"http://127.0.0.1:{port}"
    with Process(f"gateway-{port}@{cpus or 'all'}", args, cpus, logs) as proc:
        try:
            wait_ready(url, proc.proc)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"gateway not ready: {exc}\n{proc.stderr_tail()}") from exc
        yield url, proc


def live_workers(gateway_url: str) -> list[dict[str, object]]:
    """The gateway's /health `workers` (empty when it does not answer)."""
    try:
        workers = httpx.get(f"{gateway_url}/health", timeout=5).json().get("workers", [])
    except (httpx.HTTPError, ValueError):
        return []
    return list(workers) if isinstance(workers, list) else []


def wait_workers(
    gateway_url: str,
    n: int,
    procs: list[Process],
    timeout: float = 600.0,
    ids: set[str] | None = None,
) -> float:
    """Until the gateway's /health lists `n` live workers (all of `ids`, when given); the seconds it took."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        for p in procs:
            p.check()
        seen = {str(w.get("id")) for w in live_workers(gateway_url)}
        if len(seen) >= n and (ids is None or ids <= seen):
            return time.monotonic() - t0
        time.sleep(0.1)
    raise TimeoutError(f"{n} workers {sorted(ids or [])} not live at {gateway_url} within {timeout} s")


def cluster_counters(gateway_url: str) -> dict[str, float]:
    """The gateway's `outpost_cluster_*` figures from /metrics (labels summed), by name without prefix."""
    try:
        text = httpx.get(f"{gateway_url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("outpost_cluster_"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{")[0].removeprefix("outpost_cluster_").removesuffix("_total")
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (its threads included), from /proc."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)
