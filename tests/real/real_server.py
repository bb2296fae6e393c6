"""The real tier's servers: `outpost serve` on a real model, given longer to start than the e2e tier's
tiny model (a real model's load and the start-up step measurements read more weights; on a CPU
shared with other work that took over 90 s here)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from e2e.server_harness import TIMEOUT_SCALE, Server

START_TIMEOUT = 600.0 * TIMEOUT_SCALE


@contextmanager
def serve(model: Path | None, *args: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """`outpost serve -m model -t 1 ARGS...` (no -m for None), ready, stopped at the end."""
    with Server(model, *args, env=env) as server:
        server.wait_ready(timeout=START_TIMEOUT)
        yield server
