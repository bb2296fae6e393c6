"""What a worker remembers of cancels: which requests to stop, and which copies were taken over.

A plain cancel (its client went away) may overtake its request: the id is remembered, and the
request is dropped when it arrives. A cancel with `before_attempt` comes when a gateway answered a
resume: the copy of an older attempt still running somewhere (its gateway's link was cut, it
never saw its replies go unroutable) sends batches nobody reads. Only such copies stop: one that
arrives later and will not ask `resume?` (a first delivery, attempt 0) is dropped; one that asks
gets an attempt of its own from the gateway and runs.
"""

from __future__ import annotations

import collections

MEMORY = 4096  # ids kept per kind: a cancel overtakes its request by far fewer than this


class CancelMemory:
    """Bounded memory of cancelled and superseded request ids, and the attempts running here."""

    def __init__(self, memory: int = MEMORY) -> None:
        self._memory = memory
        self._cancelled: collections.OrderedDict[str, int | None] = collections.OrderedDict()
        self._superseded: collections.OrderedDict[str, int | None] = collections.OrderedDict()
        self._attempts: dict[str, int] = {}  # request id -> attempt of the copy running here

    def started(self, request_id: str, attempt: int) -> None:
        self._attempts[request_id] = attempt

    def ended(self, request_id: str) -> None:
        self._attempts.pop(request_id, None)

    def should_stop(self, request_id: str, before_attempt: int | None) -> bool:
        """Whether the copy running here must stop; a cancel for a copy not running is remembered."""
        running = self._attempts.get(request_id)
        if before_attempt is None:
            if running is not None:
                return True
            self._remember(self._cancelled, request_id, None)
            return False
        if running is not None:
            return running < before_attempt
        self._remember(self._superseded, request_id, before_attempt)
        return False

    def take_cancelled(self, request_id: str) -> bool:
        """True (once) when the request was cancelled before it arrived here."""
        if request_id not in self._cancelled:
            return False
        del self._cancelled[request_id]
        return True

    def superseded(self, request_id: str) -> bool:
        """Whether a copy that will not ask `resume?` (attempt 0) was already taken over."""
        return request_id in self._superseded

    def _remember(self, table: collections.OrderedDict[str, int | None], rid: str, value: int | None) -> None:
        table[rid] = value
        table.move_to_end(rid)
        while len(table) > self._memory:
            table.popitem(last=False)
