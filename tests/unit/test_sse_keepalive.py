"""SSE keep-alive comments while a stream waits for its next event (queued, or in a long prefill).

The body is held on an asyncio.Event: the comments come while it is held, never by racing a clock.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from outpost.api.pipeline.sse import KEEPALIVE, with_keepalive


class HeldBody:
    """An SSE body that sends one chunk, then waits until released, then sends one more."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.closed = False

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            yield b"data: role\n\n"
            await self.release.wait()
            yield b"data: token\n\n"
        finally:
            self.closed = True


def test_comments_flow_while_the_body_is_held_and_stop_when_it_speaks() -> None:
    async def main() -> tuple[list[bytes], HeldBody]:
        body = HeldBody()
        seen: list[bytes] = []
        async for chunk in with_keepalive(body(), 0.01):
            seen.append(chunk)
            if seen.count(KEEPALIVE) == 3:
                body.release.set()
        return seen, body

    seen, body = asyncio.run(asyncio.wait_for(main(), 30))
    assert seen[0] == b"data: role\n\n" and seen[-1] == b"data: token\n\n"
    assert seen[1:-1] == [KEEPALIVE] * 3
    assert body.closed


def test_no_comments_when_events_come_in_time_or_when_turned_off() -> None:
    async def main(interval: float) -> list[bytes]:
        body = HeldBody()
        body.release.set()
        return [c async for c in with_keepalive(body(), interval)]

    assert asyncio.run(main(3600.0)) == [b"data: role\n\n", b"data: token\n\n"]
    assert asyncio.run(main(0.0)) == [b"data: role\n\n", b"data: token\n\n"]


def test_leaving_while_the_body_waits_ends_the_body() -> None:
    async def main() -> HeldBody:
        body = HeldBody()
        stream = with_keepalive(body(), 0.01)
        assert await anext(stream) == b"data: role\n\n"
        assert await anext(stream) == KEEPALIVE  # the body is waiting inside its task
        await stream.aclose()  # the client went away
        for _ in range(100):  # the body's task runs its cleanup on its next turn
            if body.closed:
                break
            await asyncio.sleep(0.01)
        return body

    assert asyncio.run(asyncio.wait_for(main(), 30)).closed


def test_every_chunk_comes_in_order_and_the_bodys_error_reaches_the_reader() -> None:
    async def failing() -> AsyncIterator[bytes]:
        for i in range(50):
            yield b"%d" % i
            await asyncio.sleep(0)
        raise ValueError("the engine failed")

    async def main() -> list[bytes]:
        seen: list[bytes] = []
        try:
            async for chunk in with_keepalive(failing(), 3600.0):
                seen.append(chunk)
        except ValueError as exc:
            assert str(exc) == "the engine failed"
            return seen
        raise AssertionError("the error was lost")

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [b"%d" % i for i in range(50)]


def test_a_cancel_inside_the_body_reaches_the_reader_instead_of_a_hang() -> None:
    async def cancelled_inside() -> AsyncIterator[bytes]:
        yield b"data: role\n\n"
        raise asyncio.CancelledError  # what an await inside the body raises when its task is cancelled

    async def main() -> list[bytes]:
        seen: list[bytes] = []
        try:
            async for chunk in with_keepalive(cancelled_inside(), 3600.0):
                seen.append(chunk)
        except asyncio.CancelledError:
            return seen
        raise AssertionError("the cancel was lost")

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [b"data: role\n\n"]
