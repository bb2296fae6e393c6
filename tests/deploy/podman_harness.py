"""Helpers for the deploy tier: podman with the project's containers.conf, the figures it reports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
# Figures the tier measures, printed at the end of the run (image size, cold start).
FIGURES: dict[str, str] = {}


def podman_env() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF", str(CONTAINERS_CONF))}


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One podman command (runc, the host's ulimits); its output as text."""
    return subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout, check=check
    )
