"""A real `outpost serve` process for e2e tests: free loopback port, bounded waits, clean stop."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.ports import free_port
from outpost.serving.engine_core import STEP_DELAY_ENV

OUTPOST = [sys.executable, "-m", "outpost.cli"]
START_TIMEOUT = 90.0
# Hang guards, not speed bets: OUTPOST_TEST_TIMEOUT_SCALE multiplies the waits of the tiers that run a
# real model (tests/real and the agent checks) where the machine is known to be slower by far
# (deploy/real-tier-arm64.sh: llama.cpp emulated by qemu-user).
TIMEOUT_SCALE = float(os.environ.get("OUTPOST_TEST_TIMEOUT_SCALE", "1"))


def paced(ms: float) -> dict[str, str]:
    """Server environment that makes every decoding step take at least `ms` milliseconds.

    How e2e tests hold the engine without racing it: a prefill of N chunks or a generation of N
    tokens then lasts at least N * ms, on any machine, so "still running" is a fact, not a bet."""
    return {STEP_DELAY_ENV: f"{ms:g}"}


class Server:
    """`outpost serve -m MODEL ARGS...` on 127.0.0.1:<free port>; stderr kept in a temp file. Without
    a model (None), no -m: ARGS say what it serves (--models-dir)."""

    def __init__(
        self, model: Path | None, *args: str, tls_ca: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.port = free_port()
        self.scheme = "https" if tls_ca else "http"
        self.url = f"{self.scheme}://127.0.0.1:{self.port}"
        self.verify: Any = ssl.create_default_context(cafile=tls_ca) if tls_ca else True
        self._err = tempfile.NamedTemporaryFile(prefix="outpost-serve-", suffix=".log", delete=False)  # noqa: SIM115
        # One thread: the tiny model needs no more, and on a CPU shared with other work llama.cpp's
        # OpenMP barrier waits for a descheduled second thread every op (measured under load
        # ~10 on 2 cores: 5 ms a token with -t 1, 200-250 ms with -t 2).
        served = ["-m", str(model)] if model is not None else []
        cmd = [*OUTPOST, "serve", *served, "--port", str(self.port), "-t", "1", *args]
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err, env=environ)

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, verify=self.verify, timeout=kwargs.pop("timeout", 60.0), **kwargs
        )

    def wait_ready(self, timeout: float = START_TIMEOUT, headers: dict[str, str] | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                r = httpx.get(f"{self.url}/health", verify=self.verify, timeout=2.0, headers=headers)
                if r.status_code == 200 and r.json()["status"] == "ok":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"server not ready within {timeout} s:\n{self.stderr()}")

    def health(self) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/health", verify=self.verify, timeout=5.0)
        body: dict[str, Any] = r.json()
        return body

    def metric(self, name: str) -> float:
        """The sum of every sample of `name` (labels ignored) on /metrics."""
        text = httpx.get(f"{self.url}/metrics", verify=self.verify, timeout=5.0).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def wait_idle(self, timeout: float) -> float:
        """Seconds until /health shows no busy slot and no queue; raises after `timeout`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            h = self.health()
            if h["slots_busy"] == 0 and h["queue_depth"] == 0:
                return time.monotonic() - start
            time.sleep(0.05)
        raise AssertionError(f"slots still busy after {timeout} s: {self.health()}")

    def stderr(self) -> str:
        return Path(self._err.name).read_text(errors="replace")

    def ready_line(self, timeout: float = 60.0) -> str:
        """The ready line (logged just after /health turns ok: waited for, not raced)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = [ln for ln in self.stderr().splitlines() if "outpost.api: ready:" in ln]
            if lines:
                return lines[0]
            time.sleep(0.1)
        raise AssertionError(f"no ready line:\n{self.stderr()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._err.close()
        return int(self.proc.returncode)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
        Path(self._err.name).unlink(missing_ok=True)


def start(
    model: Path | None,
    *args: str,
    tls_ca: str | None = None,
    headers: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
) -> Server:
    server = Server(model, *args, tls_ca=tls_ca, env=env)
    server.wait_ready(headers=headers)
    return server


def assert_openai_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"}, body
    err: dict[str, Any] = body["error"]
    # OpenAI's four fields; a context overflow adds llama-server's two figures
    assert set(err) - {"n_prompt_tokens", "n_ctx"} == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code, err
    return err


def sse_events(lines: Any) -> list[Any]:
    """Parsed `data:` payloads of an SSE body ('[DONE]' kept as the string)."""
    import json

    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def anon_huge_pages_kb(pid: int) -> int:
    """A process's anonymous memory on transparent huge pages, in KiB."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    raise AssertionError("no AnonHugePages line in smaps_rollup")
