"""A worker's requests on its backend: each one from `submit` to its final event, replied per step.

`BackendRequests` submits a request to the worker's `InferenceBackend` and sends its events to the
request's gateway a batch per engine step (`outbox.step_batches`) through the `send` it is given. A batch
the broker cannot route means the gateway is gone: the request is aborted and nothing more is sent (soon
after the worker's own reconnect the gateway may still be declaring its reply queue again, so the batch
is retried first: broker/publish.py). A request the backend refuses ends with one final error event,
carrying serve's 400 when it is too long for the backend's context. It also ends the copy still running
here of a request redelivered after this worker's own channel broke, and tells `CancelMemory` which
attempt of each request runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from aiormq.exceptions import PublishError

from outpost.backend import EventStream, InferenceBackend
from outpost.cluster import wire
from outpost.cluster.broker.publish import publish_to_gateway
from outpost.cluster.worker.cancels import CancelMemory
from outpost.cluster.worker.outbox import step_batches
from outpost.messages import (
    BackendUnavailable,
    ContextExceeded,
    FinishReason,
    GenerateRequest,
    QueueFull,
    RequestRejected,
    TokenEvent,
)

_log = logging.getLogger("outpost.cluster.worker")

SendBatch = Callable[[wire.ReplyBatch], Awaitable[None]]  # returns once the batch is confirmed


def final_without_running(request: GenerateRequest) -> TokenEvent | None:
    """The final event of a request that needs no run (its deadline passed, or nothing is left)."""
    rid = request.request_id
    if request.deadline is not None and request.deadline <= time.monotonic():
        return TokenEvent(rid, finish_reason=FinishReason.TIMEOUT, error="deadline passed in the queue")
    if request.max_tokens <= request.n_resumed:  # a resumed request that had sent all its tokens
        return TokenEvent(rid, finish_reason=FinishReason.LENGTH)
    return None


class BackendRequests:
    """The requests a worker's backend is running, by id."""

    def __init__(
        self,
        backend: InferenceBackend,
        worker_id: str,
        cancels: CancelMemory,
        since_connected: Callable[[], float],
    ) -> None:
        self.backend = backend
        self.worker_id = worker_id
        self.cancels = cancels
        self.since_connected = since_connected  # seconds since the worker's last (re)connect
        self.running: dict[str, EventStream] = {}
        self._orphaned: set[str] = set()  # ended because their gateway's reply queue was not there

    def take_orphaned(self, rid: str) -> bool:
        """Whether `rid` ended because its gateway could not be reached (once)."""
        if rid in self._orphaned:
            self._orphaned.discard(rid)
            return True
        return False

    async def end_stale_copy(self, rid: str) -> None:
        """A redelivery after our own channel broke: the copy still running here is doomed, end it."""
        if rid not in self.running:
            return
        await self.backend.abort(rid)
        for _ in range(1000):  # bounded: the engine ends an aborted request within a step
            if rid not in self.running:
                return
            await asyncio.sleep(0.01)

    async def generate(
        self,
        request: GenerateRequest,
        send: SendBatch,
        attempt: int,
        seq: int,
        submitted: Callable[[], None] | None = None,
    ) -> TokenEvent:
        """Run `request`, replying a batch per engine step through `send`; returns its final event.
        `submitted` is called once the backend has it (or refused it)."""
        rid = request.request_id
        try:
            try:
                stream = await self.backend.submit(request)
            finally:
                if submitted is not None:
                    submitted()
        except (QueueFull, RequestRejected, RuntimeError) as exc:
            # Too long for this worker's context (a gateway that had not seen it yet): serve's 400.
            # Not now (its model could not load within the pool's wait): serve's 503 + Retry-After.
            over = exc if isinstance(exc, ContextExceeded) else None
            later = exc if isinstance(exc, BackendUnavailable) else None
            final = TokenEvent(
                rid,
                finish_reason=FinishReason.ERROR,
                error=str(exc),
                error_param=None if over is None else over.param,
                error_counts=None if over is None else (over.n_prompt, over.n_ctx),
                error_retry_after=None if later is None else later.retry_after,
            )
            with contextlib.suppress(PublishError):
                await send(wire.ReplyBatch(rid, attempt, seq, [final]))
            return final
        self.running[rid] = stream
        self.cancels.started(rid, attempt)
        try:
            gateway_gone = False
            batch: list[TokenEvent] = []
            async with contextlib.aclosing(step_batches(stream)) as batches:
                async for batch in batches:
                    if gateway_gone:
                        continue  # aborted: wait for the backend's final event, send nothing
                    if await self._send_or_gone(send, wire.ReplyBatch(rid, attempt, seq, batch)):
                        seq += 1
                    else:
                        _log.warning(
                            "worker %s: the gateway of %s cannot be reached; stopping it", self.worker_id, rid
                        )
                        gateway_gone = True
                        self._orphaned.add(rid)
                        if not batch[-1].finished:
                            await self.backend.abort(rid)
            return batch[-1]
        finally:
            # Also when cancelled (the connection broke): the slot is freed, the broker redelivers.
            await stream.aclose()
            self.running.pop(rid, None)
            self.cancels.ended(rid)

    async def _send_or_gone(self, send: SendBatch, batch: wire.ReplyBatch) -> bool:
        """Send `batch`; False if its gateway is gone. Unroutable soon after this worker's own
        (re)connect means it may still be declaring its reply queue again: the batch is retried
        (the backend's next events wait in its stream meanwhile)."""
        return await publish_to_gateway(lambda: send(batch), self.since_connected)
