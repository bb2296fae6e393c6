"""An asyncio event loop whose clock is virtual: `run_virtual(coro)` runs it with no real waiting.

When every task is blocked on a timer, the loop asks its selector to wait until the earliest one;
this selector instead moves the loop's clock forward by exactly that much and returns at once. So
`asyncio.sleep(0.42)` takes 0.42 virtual seconds and no real time, and a schedule checked against
`loop.time()` is exact on any machine, however fast or loaded. Only for code that does no real I/O
(a send function that is a coroutine, not a socket).
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _FastForwardSelector(selectors.DefaultSelector):
    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:  # nothing scheduled and nothing ready: a real wait would hang forever
            raise RuntimeError("virtual time: every task is blocked with no timer pending")
        if timeout > 0 and self.loop is not None:
            self.loop.advance(timeout)
        return super().select(0)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        selector = _FastForwardSelector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(coro)
