"""Running `outpost worker`: one `Worker` (service.py) until SIGTERM / SIGINT, then its drain."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from typing import TYPE_CHECKING

from outpost.backend import InferenceBackend
from outpost.cluster.worker.served import ServedModel
from outpost.cluster.worker.service import Worker

if TYPE_CHECKING:
    from outpost.tracing import Tracer

_log = logging.getLogger("outpost.cluster.worker")


async def serve_worker(
    url: str | Sequence[str],
    model: str | Sequence[ServedModel],
    backend: InferenceBackend | None,
    worker_id: str | None = None,
    tracer: Tracer | None = None,
    quorum_size: int | None = None,
) -> int:
    """Run a worker until SIGTERM / SIGINT, then drain; returns the exit code. `model` and `backend`:
    its one model; or `model` lists several (each with its backend) and `backend` is None."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(url, model, backend, worker_id, tracer, quorum_size)
    try:
        await worker.run(stop)
    finally:
        if tracer is not None:
            tracer.flush()
    _log.warning("worker %s: drained after %d requests", worker.worker_id, worker.completed)
    return 0
