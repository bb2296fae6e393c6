"""The soak's server side (benchmarks/soak/): starting `outpost serve` pinned to CPUs, and
watching a server's RSS and /health while the load runs and after it. Part of the soak benchmark,
not run on its own."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

import httpx

from benchmarks.harness.common import bench_model, log, wait_ready
from benchmarks.harness.ports import free_port
from benchmarks.soak.report import Sample, Settle
from outpost.engine.config import available_cpus


def cpu_count(cpus: str) -> int:
    """Cores in a taskset list such as `1`, `0,2` or `2-5`."""
    n = 0
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


class ServerProcess:
    """`outpost serve` on a free loopback port, its log in `log_path`; SIGTERM (then kill) on exit."""

    def __init__(self, args: argparse.Namespace, log_path: Path) -> None:
        model = bench_model(args.shape, args.quant)
        threads = args.threads or (cpu_count(args.cpus) if args.cpus else available_cpus())
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        flags = f"-m {model} -np {args.parallel} -c {args.ctx_size} -t {threads} --max-queue {args.max_queue}"
        cmd = [sys.executable, "-m", "outpost.cli", "serve", *flags.split(), "--port", str(port)]
        cmd = ["taskset", "-c", args.cpus, *cmd] if args.cpus else cmd  # taskset execs: same pid
        self.cmd = [*cmd, *args.serve_arg]
        self._log: IO[bytes] = log_path.open("wb")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)

    def __enter__(self) -> ServerProcess:
        try:
            wait_ready(self.url, self.proc)
        except BaseException:
            self.__exit__()
            raise
        log(f"server ready on {self.url} (pid {self.proc.pid}): {' '.join(self.cmd)}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(45)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


class Watch:
    """The server as the monitor sees it: RSS (/proc/PID/status, else /metrics) and /health."""

    def __init__(self, client: httpx.AsyncClient, pid: int | None, proc: subprocess.Popen[bytes] | None):
        self.client, self.pid, self.proc = client, pid, proc

    def exited(self) -> int | None:
        return self.proc.poll() if self.proc is not None else None

    async def rss(self) -> int | None:
        if self.pid is not None:
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return None
            kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")), None)
            return int(kib) * 1024 if kib else None
        try:
            text = (await self.client.get("/metrics")).text
        except httpx.HTTPError:
            return None
        line = next((li for li in text.splitlines() if li.startswith("process_resident_memory_bytes")), "")
        return int(float(line.split()[-1])) if line else None

    async def health(self) -> dict[str, Any] | None:
        try:
            r = await self.client.get("/health")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    async def sample(self, t: float) -> Sample:
        health = await self.health() or {}
        return Sample(t, await self.rss(), health.get("slots_busy"), health.get("queue_depth"))

    async def settle(self, limit_s: float) -> Settle:
        """Poll /health until no slot is busy and nothing is queued, for at most `limit_s`."""
        start = time.monotonic()
        for _ in range(int(limit_s / 0.25) + 2):
            health = await self.health() or {}
            busy, queue = health.get("slots_busy"), health.get("queue_depth")
            elapsed = time.monotonic() - start
            if (busy == 0 and queue == 0) or elapsed >= limit_s:
                return Settle(busy, queue, elapsed, busy == 0 and queue == 0)
            await asyncio.sleep(0.25)
        return Settle(busy, queue, time.monotonic() - start, False)

    async def rss_settled(self) -> int | None:
        """The median of three readings, half a second apart, once idle."""
        values = []
        for _ in range(3):
            await asyncio.sleep(0.5)
            values.append(await self.rss())
        known = [v for v in values if v is not None]
        return int(statistics.median(known)) if known else None
