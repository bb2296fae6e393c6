"""A gateway's requests in flight, and which of them it sends again (only what the broker lost).

`Pending` is one request as the gateway tracks it: what the client has been sent, the attempt the
gateway expects replies from, and when a worker was last heard about it. A lost link loses none of
them by itself: the gateway's reply queue outlives its connection (topology.reply_arguments), so
workers keep replying into it through a cut link and the gateway reads on where it stopped; a
broker restart or a node's death returns what workers held to the quorum queue, and the worker
that takes it again asks `resume?`. A request is sent again (`resubmit`, marked so its taker asks
`resume?` too) only when the broker really lost it:

- a worker could not reach the gateway's reply queue (gone with its node, or expired) and handed
  the request back through the gateway's parked queue instead of dropping it;
- replies of the running copy were lost (a batch arrived past a gap in its sequence): the copy
  that takes the resubmission asks `resume?`, whose answer stops the old one;
- the gateway's reply queue itself was lost (a broker restart: it is not durable) with the last
  replies of a request in it: the worker had finished and acked it, so nothing is left to resume it.
  A started request that no worker has replied to or asked `resume?` about within
  `LOST_REPLIES_GRACE_S` of the gateway's reconnect (`silent_since`) is sent again; one a worker
  still holds has asked `resume?` by then (the broker returned it to the queue's head).

A request still in the quorum queue, or streaming, is never sent again.

A publish the broker nacks is either the queue at its length limit (429) or a quorum queue that
cannot take it now (no leader while a node is lost: 503, retry): `nack_is_full` tells them apart
by a fresh depth read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiormq.exceptions import AMQPError, DeliveryError, PublishError

from outpost.cluster import wire
from outpost.messages import GenerateRequest, TokenEvent

_log = logging.getLogger("outpost.cluster.gateway")

RESUBMIT_TRIES = 5  # a nack while a quorum queue elects a leader: tried again, 1 s, 2 s, ... apart
# After a reconnect that found the reply queue gone: time for the workers to connect again and ask
# `resume?` about what they held (their reconnect retries every second) before the rest is sent again.
LOST_REPLIES_GRACE_S = 10.0


@dataclass
class Pending:
    request: GenerateRequest
    model: str
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    attempt: int = 0
    next_seq: int = 0
    sent: list[int] = field(default_factory=list)
    finished: bool = False
    heard: float = field(default_factory=time.monotonic)  # a reply batch or a resume query
    resubmitted_at: int = -1  # the attempt it was last sent again at (once per attempt)
    resumed_by: str = ""  # who asked the last `resume?` answered: the same asker gets the same answer

    @property
    def started(self) -> bool:
        """A worker has replied or asked to resume it: it holds a slot, it no longer waits."""
        return self.next_seq > 0 or self.attempt > 0

    def needs_resubmit(self) -> bool:
        """Not yet sent again for its current attempt (a gap and a parked copy may both report it)."""
        if self.finished or self.resubmitted_at == self.attempt:
            return False
        self.resubmitted_at = self.attempt
        return True


Publish = Callable[[Pending], Awaitable[None]]


async def resubmit(pending: dict[str, Pending], item: Pending, publish: Publish) -> bool:
    """Publish `item` again, trying a nack again (a quorum queue electing a leader); False when it
    ended meanwhile or could not be sent (then it ends by its deadline or the outage bound)."""
    rid = item.request.request_id
    for tries in range(1, RESUBMIT_TRIES + 1):
        if pending.get(rid) is not item or item.finished:
            return False
        try:
            await publish(item)
            return True
        except (PublishError, DeliveryError, TimeoutError, AMQPError, OSError, RuntimeError) as exc:
            if tries == RESUBMIT_TRIES:
                _log.warning("could not resubmit %s: %r", rid, exc)
            else:
                await asyncio.sleep(float(tries))
    return False


def silent_since(pending: dict[str, Pending], since: float) -> list[Pending]:
    """The started requests no worker has replied to or asked about since `since` (a reconnect):
    their last replies went with a lost reply queue. Requests still waiting for a slot are in the
    quorum queue, which a broker restart keeps."""
    return [p for p in pending.values() if p.started and not p.finished and p.heard < since]


def resume_answer(pending: Pending | None, query: wire.ResumeQuery) -> tuple[wire.ResumeState, bool]:
    """The answer to a worker's `resume?`, and whether it starts a new attempt. The same asker asking
    again (its answer was late or lost) gets the same attempt; a request that ended is `gone`."""
    rid = query.request_id
    if pending is None or pending.finished:
        return wire.ResumeState(rid, 0, 0, gone=True), False
    new = not query.asker or query.asker != pending.resumed_by
    if new:
        pending.attempt += 1
        pending.resumed_by = query.asker
        pending.heard = time.monotonic()
    return wire.ResumeState(rid, pending.attempt, pending.next_seq, list(pending.sent)), new


def nack_is_full(depth: int | None, limit: int | None) -> bool:
    """Whether a nacked publish met the queue's length limit (else the queue could not take it
    now). `depth`: read just after the nack (None: the read failed too); `limit`: the length policy
    in force (None: none was set, so no nack comes from length)."""
    if limit is None or depth is None:
        return False
    return depth >= limit - max(1, limit // 10)  # consumers may have taken a few meanwhile
