"""A worker's replies to one gateway, coalesced: one message carries every request's new events.

At 8 streams an engine step yields 8 requests' tokens together; sent one message each, the worker
(on the engine's own cores), the broker and the gateway handle 8 messages a step. A `ReplyOutbox`
sends them as one `bundle`: while a bundle's publisher confirm is awaited, the batches that arrive
are gathered, and go out together once it is confirmed. Each request still waits for its own batch's
confirm before sending the next, so its batches stay in order and it has at most one in flight; an
unroutable bundle (its gateway is gone) fails every request in it, as an unroutable batch did.

`step_batches` reads one request's `EventStream` (its backend's) as the batches to send: all the
events that arrived while the previous batch was being confirmed.

Only gateways that said they read bundles get them (`wire.reads_bundles` on the request): an older
gateway keeps getting one `events` message per request and step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import contextmanager

from outpost.backend import EventStream
from outpost.cluster import wire
from outpost.messages import FinishReason, TokenEvent

Publish = Callable[[bytes, str], Awaitable[None]]  # (body, correlation id) -> confirmed


async def step_batches(stream: EventStream) -> AsyncGenerator[list[TokenEvent], None]:
    """The stream's events, each batch all that arrived since the last was taken; the last batch
    ends with the final event (an ERROR one if the stream broke or ended without it)."""
    events: asyncio.Queue[TokenEvent] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for event in stream:
                events.put_nowait(event)
                if event.finished:
                    return
            error = "the stream ended without a final event"
        except Exception as exc:  # the backend failed it: the client hears an error, not silence
            error = str(exc) or type(exc).__name__
        events.put_nowait(TokenEvent(stream.request_id, finish_reason=FinishReason.ERROR, error=error))

    reader = asyncio.create_task(pump())
    try:
        finished = False
        while not finished:
            batch = [await events.get()]
            while not events.empty() and not batch[-1].finished:  # what earlier steps queued
                batch.append(events.get_nowait())
            finished = batch[-1].finished
            yield batch
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


class ReplyOutbox:
    """The replies bound for one gateway queue; `send` returns once the batch's bundle is confirmed."""

    def __init__(self, publish: Publish) -> None:
        self._publish = publish
        self._waiting: list[tuple[wire.ReplyBatch, asyncio.Future[None]]] = []
        self._sender: asyncio.Task[None] | None = None
        self.bundles_sent = 0

    @property
    def idle(self) -> bool:
        return not self._waiting and (self._sender is None or self._sender.done())

    async def send(self, batch: wire.ReplyBatch) -> None:
        """Queue `batch` for the next bundle; raises what publishing that bundle raised."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieve)  # its request may have been cancelled meanwhile
        self._waiting.append((batch, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all())
        await asyncio.shield(future)  # a cancelled request must not cancel the others' bundle

    async def _send_all(self) -> None:
        while self._waiting:
            items, self._waiting = self._waiting, []
            batches = [batch for batch, _ in items]
            correlation = batches[0].request_id if len(batches) == 1 else ""
            try:
                await self._publish(wire.encode_bundle(batches), correlation)
            except Exception as exc:
                _settle(items, exc)
                continue
            except BaseException:  # cancelled: nothing more goes out
                _settle(items + self._waiting, RuntimeError("the worker is stopping"))
                self._waiting = []
                raise
            self.bundles_sent += 1
            _settle(items, None)


def _settle(items: list[tuple[wire.ReplyBatch, asyncio.Future[None]]], error: Exception | None) -> None:
    for _, future in items:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


def _retrieve(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()


class Outboxes:
    """A worker's outbox per gateway queue, kept while some request of that gateway runs."""

    def __init__(self, publish: Callable[[str, bytes, str], Awaitable[None]]) -> None:
        self._publish = publish  # (queue, body, correlation id) -> confirmed
        self._boxes: dict[str, ReplyOutbox] = {}
        self._users: dict[str, int] = {}

    @contextmanager
    def open(self, reply_to: str) -> Iterator[ReplyOutbox]:
        box = self._boxes.get(reply_to)
        if box is None:
            box = self._boxes[reply_to] = ReplyOutbox(functools.partial(self._publish, reply_to))
        self._users[reply_to] = self._users.get(reply_to, 0) + 1
        try:
            yield box
        finally:
            self._users[reply_to] -= 1
            if not self._users[reply_to]:  # a gateway that went leaves nothing behind
                del self._users[reply_to], self._boxes[reply_to]

    def __len__(self) -> int:
        return len(self._boxes)
