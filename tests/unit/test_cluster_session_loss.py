"""A background loop's broker call cancelled by its connection (aiormq cancels the calls waiting on
a connection it finds stuck) goes on; the loop's own cancellation still ends it."""

from __future__ import annotations

import asyncio

import pytest

from outpost.cluster.broker.session import survive_connection_loss


def test_a_call_cancelled_by_the_connection_does_not_end_the_loop() -> None:
    async def main() -> int:
        rounds = 0
        for _ in range(3):
            waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(waiting.cancel)  # as aiormq does to a stuck call
            with survive_connection_loss():
                await waiting
            rounds += 1
        return rounds

    assert asyncio.run(main()) == 3


def test_the_loops_own_cancellation_ends_it() -> None:
    async def loop(started: asyncio.Event) -> None:
        while True:
            with survive_connection_loss():
                started.set()
                await asyncio.sleep(3600)

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.ensure_future(loop(started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)

    asyncio.run(main())
