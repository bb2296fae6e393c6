"""Real `outpost gateway` / `outpost worker` processes for the cluster e2e tests."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from server_harness import OUTPOST, free_port

START_TIMEOUT = 120.0


class Proc:
    """A child process with its stderr in a temp file."""

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self._err = tempfile.NamedTemporaryFile(prefix="outpost-cluster-", suffix=".log", delete=False)  # noqa: SIM115
        environ = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err, env=environ)

    def stderr(self) -> str:
        return Path(self._err.name).read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return int(self.proc.wait(timeout))

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


def worker(
    broker: Any,
    model: Path | None,
    *args: str,
    step_delay_ms: int = 0,
    worker_id: str = "",
    env: dict[str, str] | None = None,
) -> Proc:
    cmd = [
        *OUTPOST,
        "worker",
        "--broker",
        broker.broker_url,
        "--broker-password-file",
        str(broker.password_file),
    ]
    cmd += [*(["-m", str(model)] if model is not None else []), "-t", "1", *args]  # None: args say
    if worker_id:
        cmd += ["--worker-id", worker_id]
    env = dict(env or {})
    if step_delay_ms:
        env["OUTPOST_DEBUG_STEP_DELAY_MS"] = str(step_delay_ms)
    return Proc(cmd, env)


class Gateway(Proc):
    def __init__(self, broker: Any, models: list[Path], *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [*OUTPOST, "gateway", "--broker", broker.broker_url]
        cmd += [
            "--broker-password-file",
            str(broker.password_file),
            "--broker-management-url",
            broker.mgmt_url,
        ]
        for m in models:
            cmd += ["-m", str(m)]
        super().__init__([*cmd, "--port", str(self.port), *args])

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/health", timeout=5.0).json()
        return body

    def wait_until(
        self, cond: Callable[[dict[str, Any]], bool], what: str, timeout: float = START_TIMEOUT
    ) -> dict[str, Any]:
        """Poll /health until `cond(health)`; raises with the logs after `timeout`."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.stderr()}")
            try:
                last = self.health()
                if cond(last):
                    return last
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"gateway: no {what} within {timeout} s; last /health {last}\n{self.stderr()}")


def live(health: dict[str, Any], model: str | None = None) -> list[dict[str, Any]]:
    return [w for w in health.get("workers", []) if model is None or w["model"] == model]
