"""LoopMailbox (serving/loop_mailbox.py): calls posted from another thread run on the loop in order,
with one wake-up of the loop per batch; a closed loop drops them instead of failing the engine."""

from __future__ import annotations

import asyncio
import threading

from outpost.serving.loop_mailbox import batched_posts, mailbox_for


def test_a_batch_of_posts_wakes_the_loop_once_and_keeps_their_order() -> None:
    loop = asyncio.new_event_loop()
    wakes: list[object] = []
    real = loop.call_soon_threadsafe

    def counting(callback, *args):  # type: ignore[no-untyped-def]
        wakes.append(callback)
        return real(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        box = mailbox_for(loop)
        assert mailbox_for(loop) is box
        got: list[int] = []

        def engine_step(first: int) -> None:  # what the engine thread does once per step
            with batched_posts():
                for i in range(first, first + 16):
                    box.post(lambda i=i: got.append(i))
                woken_inside.append(len(wakes))

        woken_inside: list[int] = []
        for first in (0, 16):
            thread = threading.Thread(target=engine_step, args=(first,))
            thread.start()
            thread.join()
            loop.run_until_complete(asyncio.sleep(0))
        box.post(lambda: got.append(32))  # outside a batch: woken at once
        loop.run_until_complete(asyncio.sleep(0))
        assert got == list(range(33))
        assert woken_inside == [0, 1], "the loop is woken when the step's batch ends, not before"
        assert len(wakes) == 3
    finally:
        loop.close()


def test_posts_to_a_closed_loop_are_dropped() -> None:
    loop = asyncio.new_event_loop()
    box = mailbox_for(loop)
    loop.close()
    box.post(lambda: None)
    box.post(lambda: None)  # not held back waiting for a drain that can never come
    assert box._items == []
