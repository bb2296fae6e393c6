"""Server-sent events, framed once for every streaming route: data lines, keep-alives, the response.

`sse(obj)` is one `data:` event; `sse_response` is the streamed reply, which cancels its
generations however it ends; `with_keepalive` sends `: keep-alive` comments while a stream waits
(queued, or in a long prefill), so proxies with idle timeouts keep it open.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from outpost.api.pipeline.generation import Generation
from outpost.api.record import RECORD_KEY, RequestRecord

T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(obj: Any, event: str | None = None) -> bytes:
    """One event: `obj` as compact JSON on its `data:` line, after an `event:` line where the
    protocol names its events (Anthropic's and the Responses API's)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


class _SseResponse(StreamingResponse):
    """A StreamingResponse that aborts its generations however it ends, even before the first byte."""

    def __init__(self, body: AsyncIterator[bytes], generations: list[Generation], media_type: str) -> None:
        super().__init__(body, media_type=media_type, headers=SSE_HEADERS)
        self._generations = generations
        self._complete = False

    async def stream_response(self, send: Send) -> None:
        await super().stream_response(send)
        self._complete = True  # not reached when the client left (cancelled, or the send failed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            record = scope.get(RECORD_KEY)
            if not self._complete and isinstance(record, RequestRecord):
                record.cancelled = True  # the access log says a cancel, not an error
            for gen in self._generations:  # a no-op for the ones that finished
                await gen.cancel()


def sse_response(
    body: AsyncIterator[bytes], generations: list[Generation], media_type: str = "text/event-stream"
) -> StreamingResponse:
    """The streamed reply; `media_type`: another framing of the same stream (Ollama's NDJSON)."""
    return _SseResponse(body, generations, media_type)


async def with_keepalive(body: AsyncIterator[bytes], interval: float) -> AsyncIterator[bytes]:
    """`body`'s chunks, with a KEEPALIVE comment whenever `interval` seconds pass without one.

    One task reads the body into a queue for the stream's whole life and a ticker task adds the
    comments: a chunk costs a queue put and get (a few microseconds), where a task and a timed
    wait per chunk cost ~45 us of the event loop's thread (2-core Xeon), which on a small CPU is
    time taken from the decode."""
    if interval <= 0:
        async for chunk in body:
            yield chunk
        return
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes | _End] = asyncio.Queue()
    last_put = [loop.time()]

    async def pump() -> None:
        try:
            async for chunk in body:
                chunks.put_nowait(chunk)
                last_put[0] = loop.time()
        except Exception as exc:  # re-raised where the stream is read
            chunks.put_nowait(_End(exc))
            return
        except BaseException as exc:  # a cancel inside the body: the reader gets it, not a hang
            chunks.put_nowait(_End(exc))
            raise
        chunks.put_nowait(_End(None))

    async def tick() -> None:
        while True:
            due = last_put[0] + interval - loop.time()
            if due > 0:
                await asyncio.sleep(due)
                continue
            chunks.put_nowait(KEEPALIVE)
            last_put[0] = loop.time()

    tasks = (asyncio.ensure_future(pump()), asyncio.ensure_future(tick()))
    try:
        while not isinstance(item := await chunks.get(), _End):
            yield item
        if item.error is not None:
            raise item.error
    finally:
        # The client left, or the body ended: a body still waiting for an event is cancelled
        # there, which runs its own cleanup (it aborts its generation).
        for task in tasks:
            task.cancel()


class _End:
    """The body ended: normally, or with the error it raised."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several async iterators as they come, tagged with the iterator's index."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    end = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                queue.put_nowait((index, item))
        except Exception as exc:
            queue.put_nowait((index, exc))
            return
        queue.put_nowait((index, end))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
