"""The wait after a request ends for its client's next one (serve's `--follow-up-wait`).

Closed loops send their next request the moment one ends: a pool of batch workers, an agent's
calls in turn, a benchmark's clients. With serial prompts (the CPU's setting, scheduler/prefill.py)
a step that reads a prompt holds the next prompt for the whole step, about 0.1 s for 130 tokens of
a 135M model on 2 cores. Without a wait, the engine starts its next step before the ended
stream's client has sent again: a decode step, a few milliseconds, in which the next stream of the
loop ends too. Its request then comes just after the first one's prompt step has started and waits
for all of it, and so does every request of the cycle after it: streams that end a step apart keep
ending a step apart (docs/performance.md, issue 47's 4-stream TTFT on an AMX Xeon). Waiting the few
milliseconds the request takes to come lets its prompt be read in the very next step, and the next
stream ends in that prompt step, so its own client's request comes after that step, not during it.

When. Only while most recent ends were followed by a request soon after (SHARE of the last WINDOW
ends within FORGET_AFTER_S, MIN_ENDS of them seen; see COUNT_BOUNDS): an open stream of arrivals is
not held up for requests that are not coming. The engine core ends the wait as soon as anything
arrives, and waits not at all where a prompt is already there to read. Pure: the core passes the
times; tests pass made-up ones.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

# Ends remembered, and how many of them must have been followed for the core to wait. Why 8: a
# loop that stops leaves its last ends unfollowed (16 of them for 16 clients), and the next loop's
# ends must outnumber those soon (the benchmark's levels run back to back, docs/performance.md).
WINDOW = 8
SHARE = 0.5
# Ends seen before any wait: a server's first requests tell nothing about its clients yet.
MIN_ENDS = 4
# Ends older than this are forgotten: after a pause the clients may be others. Why: a loop that
# stops leaves its last ends unfollowed, and a window full of them kept the next loop from
# qualifying for its first 8 ends (the benchmark's later rounds, docs/performance.md).
FORGET_AFTER_S = 10.0
# A request counts as an end's follow-up within this many bounds of it. Why more than one: while
# the core does not wait, its next step keeps the CPU busy and the request comes later than it
# would to an idle one; counting only those within the bound would keep a loop from ever
# qualifying on a small CPU.
COUNT_BOUNDS = 2.0


@dataclass(slots=True)
class _End:
    at: float
    followed: bool = False


class FollowUps:
    """Whether the ends of recent steps were followed by a new request soon after (see above)."""

    def __init__(self, max_wait_s: float) -> None:
        if max_wait_s < 0:
            raise ValueError(f"the follow-up wait must be 0 (off) or more seconds (got {max_wait_s})")
        self.max_wait_s = max_wait_s
        self._ends: deque[_End] = deque(maxlen=WINDOW)

    def ended(self, now: float) -> None:
        """A step ended one request or more at `now` (one end, however many it ended)."""
        while self._ends and now - self._ends[0].at > FORGET_AFTER_S:
            self._ends.popleft()
        self._ends.append(_End(now))

    def submitted(self, now: float) -> None:
        """A request arrived at `now`: the follow-up of the oldest end not yet followed that it is
        soon enough after. Streams of a loop may end in consecutive steps, a few ms apart, so
        the first end's request can come after the second end."""
        for end in self._ends:
            if not end.followed and 0.0 <= now - end.at <= COUNT_BOUNDS * self.max_wait_s:
                end.followed = True
                return

    def wait_s(self) -> float:
        """Seconds to wait for a follow-up just after `ended()`: the bound while most earlier ends
        were followed, else 0. The end just recorded has not had its chance, so it is left out."""
        earlier = list(self._ends)[:-1]
        if self.max_wait_s <= 0 or len(earlier) < MIN_ENDS:
            return 0.0
        followed = sum(end.followed for end in earlier)
        return self.max_wait_s if followed >= SHARE * len(earlier) else 0.0

    @property
    def followed(self) -> int:
        """Ends of the window that were followed (for tests and diagnostics)."""
        return sum(end.followed for end in self._ends)

    def describe(self) -> str:
        """For the ready line."""
        if self.max_wait_s <= 0:
            return "follow-up wait off"
        return f"follow-up wait up to {self.max_wait_s * 1000:g} ms after a request ends (closed loops)"
