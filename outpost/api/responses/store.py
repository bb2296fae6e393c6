"""The Responses API's memory: finished responses by id, for `previous_response_id` and GET.

Bounded two ways: at most `max_items` responses (the least recently used goes first) and each for
at most `ttl` seconds after it was stored. It lives in one process: a gateway's store holds only
the responses that gateway answered, so a follow-up that reaches another gateway (or this one
after a restart, or after eviction) gets a 404 naming the id, and the client resends the history
in `input` instead. The clock is injectable so tests need no sleeping.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Stored:
    """A finished response and the conversation that led to it, as chat messages (for a follow-up)."""

    response: dict[str, Any]
    messages: list[dict[str, Any]]
    expires: float


class ResponseStore:
    def __init__(self, max_items: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_items = max_items
        self.ttl = ttl
        self._clock = clock
        self._items: OrderedDict[str, Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, rid: str, response: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        if self.max_items <= 0:
            return
        self._expire()
        self._items[rid] = Stored(response, messages, self._clock() + self.ttl)
        self._items.move_to_end(rid)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def get(self, rid: str) -> Stored | None:
        self._expire()
        item = self._items.get(rid)
        if item is not None:
            self._items.move_to_end(rid)
        return item

    def delete(self, rid: str) -> bool:
        return self._items.pop(rid, None) is not None

    def _expire(self) -> None:
        now = self._clock()
        for rid in [r for r, s in self._items.items() if s.expires <= now]:
            del self._items[rid]
