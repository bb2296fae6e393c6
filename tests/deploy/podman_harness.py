"""Helpers for the deploy tier: podman with the project's containers.conf, a podman-compose project,
the figures the tier reports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.ports import free_ports  # noqa: F401  (re-exported for the compose tests)

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
COMPOSE_DIR = Path(__file__).resolve().parent / "compose"  # the compose overlays and the stand-in broker
RABBITMQ_IMAGE = "localhost/outpost-test-rabbitmq:latest"
# Figures the tier measures, printed at the end of the run (image size, cold start).
FIGURES: dict[str, str] = {}


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One podman command (runc, the host's ulimits); its output as text."""
    return subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout, check=check
    )


def built_image(variable: str, figure: str, arch: str | None = None) -> str:
    """The image named by `variable` (make test-deploy passes the one it built), else one built now with
    deploy/image.sh (for `arch`, or this machine's); its size becomes a deploy figure."""
    name = os.environ.get(variable)
    if not name:
        env = {**podman_env(), **({"ARCH": arch} if arch else {})}
        out = subprocess.run(
            [str(ROOT / "deploy" / "image.sh")], env=env, capture_output=True, text=True, timeout=3600
        )
        assert out.returncode == 0, out.stderr[-4000:]
        name = out.stdout.strip().splitlines()[-1]
    size = int(podman("image", "inspect", "--format", "{{.Size}}", name).stdout)
    FIGURES[figure] = f"{name}, {size / 1e6:.0f} MB"
    return name


def live_workers(health: dict[str, Any]) -> list[dict[str, Any]]:
    """The workers a gateway's /health lists as serving (not draining)."""
    workers = health.get("workers", [])
    return [w for w in workers if not w.get("draining")] if isinstance(workers, list) else []


class ComposeProject:
    """One podman-compose project (its own name, files and environment), as a user drives it."""

    def __init__(self, project: str, files: list[Path], env: dict[str, str]) -> None:
        self.project, self.files, self.env = project, files, env

    def compose(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "podman_compose", "-p", self.project]
        for f in self.files:
            cmd += ["-f", str(f)]
        return subprocess.run(
            [*cmd, *args], env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def container(self, service: str, index: int = 1) -> str:
        return f"{self.project}_{service}_{index}"  # podman-compose's naming

    def containers(self) -> list[str]:
        out = podman(
            "ps", "-a", "--format", "{{.Names}} {{.Status}}",
            "--filter", f"label=io.podman.compose.project={self.project}",
        )  # fmt: skip
        return out.stdout.splitlines()

    def logs(self, tail: int = 15) -> str:
        parts = []
        for line in self.containers():
            name = line.split()[0]
            log = podman("logs", "--tail", str(tail), name, check=False)
            parts.append(f"== {line}\n{(log.stdout + log.stderr)[-1500:]}")
        return "\n".join(parts)

    def wait_live_workers(self, url: str, n: int, limit_s: float) -> dict[str, Any]:
        """The gateway's /health once it lists `n` live workers (polled, bounded)."""
        deadline = time.monotonic() + limit_s
        health: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                health = httpx.get(url + "/health", timeout=5).json()
                if len(live_workers(health)) == n:
                    return health
            except (httpx.TransportError, ValueError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"no {n} live workers within {limit_s} s: {health}\n{self.logs()}")

    def down(self) -> None:
        """`down -v`, then nothing of the project is left: no container, no volume."""
        down = self.compose("down", "-v", timeout=300)
        assert down.returncode == 0, down.stderr[-4000:]
        assert self.containers() == []
        label = f"label=io.podman.compose.project={self.project}"
        assert podman("volume", "ls", "-q", "--filter", label).stdout.split() == []
