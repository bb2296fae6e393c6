"""A worker's two side channels: gateways' cancels (the control fanout) and their answers to its
`resume?` questions (its private queue).

A cancel names a request id and, for a request resumed elsewhere, the attempt it supersedes; the
worker ends its copy on whichever backend runs it (an id unknown to a backend is nothing to it). An
answer to `resume?` completes the question waiting for it (resume.ask_resume).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TypeVar

from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from outpost.cluster import wire
from outpost.cluster.worker.cancels import CancelMemory
from outpost.cluster.worker.resume import ask_resume
from outpost.cluster.worker.served import ServedModel

_log = logging.getLogger("outpost.cluster.worker")

T = TypeVar("T")


def _decoded(decode: Callable[[bytes], T], body: bytes, what: str) -> T | None:
    """The decoded message, or None (logged) when it is not one this version reads."""
    try:
        return decode(body)
    except wire.WireError as exc:
        _log.warning("ignoring %s: %s", what, exc)
        return None


class SideChannels:
    """Cancels and resume answers for one worker, which serves the models in `served`."""

    def __init__(self, worker_id: str, cancels: CancelMemory, served: Mapping[str, ServedModel]) -> None:
        self.worker_id = worker_id
        self.cancels = cancels
        self._served = served
        self._resumes: dict[str, asyncio.Future[wire.ResumeState]] = {}

    async def on_control(self, message: AbstractIncomingMessage) -> None:
        cancel = _decoded(wire.decode_cancel, message.body, "a control message")
        if cancel is not None and self.cancels.should_stop(cancel.request_id, cancel.before_attempt):
            if cancel.before_attempt is not None:
                rid = cancel.request_id
                _log.warning("worker %s: %s was resumed elsewhere; ending this copy", self.worker_id, rid)
            for m in self._served.values():
                await m.backend.abort(cancel.request_id)

    async def on_private(self, message: AbstractIncomingMessage) -> None:
        state = _decoded(wire.decode_resume, message.body, "a message on the private queue")
        if state is None:
            return
        future = self._resumes.get(state.request_id)
        if future is not None and not future.done():
            future.set_result(state)

    async def ask_resume(
        self,
        exchange: AbstractExchange,
        private: str,
        rid: str,
        reply_to: str,
        since_connected: Callable[[], float],
    ) -> wire.ResumeState | None:
        """What the client already has (resume.ask_resume); None when its gateway is gone."""
        future: asyncio.Future[wire.ResumeState] = asyncio.get_running_loop().create_future()
        self._resumes[rid] = future
        try:
            return await ask_resume(exchange, private, rid, reply_to, future, since_connected)
        finally:
            self._resumes.pop(rid, None)
