"""A worker's replies to one gateway, coalesced: one message carries every request's new events.

At 8 streams an engine step yields 8 requests' tokens together; sent one message each, the worker
(on the engine's own cores), the broker and the gateway handle 8 messages a step. A `ReplyOutbox`
sends them as one `bundle`: while a bundle's publisher confirm is awaited, the batches that arrive
are gathered, and go out together once it is confirmed. Each request still waits for its own batch's
confirm before sending the next, so its batches stay in order and it has at most one in flight; an
unroutable bundle (its gateway is gone) fails every request in it, as an unroutable batch did.

Only gateways that said they read bundles get them (`wire.reads_bundles` on the request): an older
gateway keeps getting one `events` message per request and step.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from outpost.cluster import wire

Publish = Callable[[bytes, str], Awaitable[None]]  # (body, correlation id) -> confirmed


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
