"""LoopMailbox: hands calls from the engine thread to an asyncio loop with one wake-up per batch.

`loop.call_soon_threadsafe` writes to the loop's self-pipe on every call; the engine thread emits
one event per stream per step, so at 16 streams that was 16 writes, and the first one woke the
loop, whose thread then held the GIL while the engine thread still had 15 events to hand over: the
engine thread's time between two `llama_decode`s is every stream's inter-token gap. A mailbox per
loop collects what arrives while the loop has not yet drained it and asks for one drain; inside
`batched_posts()` (the engine's emit) the drain is asked for once, at the end.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_BY_LOOP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopMailbox] = weakref.WeakKeyDictionary()
_BY_LOOP_LOCK = threading.Lock()
_batch = threading.local()  # .boxes: the mailboxes posted to inside this thread's batched_posts()


class LoopMailbox:
    """Calls to run on one loop, posted from any thread, run there in posting order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[Callable[[], object]] = []

    def post(self, call: Callable[[], object]) -> None:
        """Queues `call` (e.g. a queue's put_nowait, bound); the first post since the last drain
        schedules the drain."""
        with self._lock:
            self._items.append(call)
            if len(self._items) > 1:
                return  # a drain is already scheduled and will take this one too
        boxes: set[LoopMailbox] | None = getattr(_batch, "boxes", None)
        if boxes is not None:
            boxes.add(self)  # woken when the batch ends
            return
        self._wake()

    def _wake(self) -> None:
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop closed: nobody is left to read the queue
            with self._lock:
                self._items.clear()

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for call in items:
            call()


def mailbox_for(loop: asyncio.AbstractEventLoop) -> LoopMailbox:
    """The one mailbox of `loop`."""
    with _BY_LOOP_LOCK:
        box = _BY_LOOP.get(loop)
        if box is None:
            box = _BY_LOOP[loop] = LoopMailbox(loop)
        return box


@contextmanager
def batched_posts() -> Iterator[None]:
    """Posts made by this thread inside the block wake each loop once, when the block ends."""
    if getattr(_batch, "boxes", None) is not None:  # nested: the outer block wakes them
        yield
        return
    boxes: set[LoopMailbox] = set()
    _batch.boxes = boxes
    try:
        yield
    finally:
        _batch.boxes = None
        for box in boxes:
            box._wake()
