"""A gateway's requests in flight, and what becomes of them when its own broker link is lost.

`Pending` is one request as the gateway tracks it: what the client has been sent, the attempt the
gateway expects replies from, and when a worker was last heard about it. When the gateway's
connection is lost (a broker restart, a node's death, a cut link), its exclusive reply queue goes
with it. Where the broker restarted or a node died, the workers lost their connections too: the
broker redelivers the requests and their workers resume them (`resume?`). Where only the gateway's
link was cut, the workers' replies were unroutable and they ended their copies: nothing would come.
So, RESUBMIT_AFTER_S after setting up again, the gateway resubmits every request no worker has
been heard about since; a copy that shows up later is ended by the resume answer's cancel.

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

from outpost.messages import GenerateRequest, TokenEvent

_log = logging.getLogger("outpost.cluster.gateway")

RESUBMIT_AFTER_S = 3.0  # after a reconnect: long enough for redelivered copies to ask `resume?`
RESUBMIT_TRIES = 5  # a nack while a quorum queue elects a leader: tried again, 1 s, 2 s, ... apart


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

    @property
    def started(self) -> bool:
        """A worker has replied or asked to resume it: it holds a slot, it no longer waits."""
        return self.next_seq > 0 or self.attempt > 0

    def silent_since(self, moment: float) -> bool:
        return not self.finished and self.heard < moment


Publish = Callable[[Pending], Awaitable[None]]


async def resubmit_silent(
    pending: dict[str, Pending], since: float, publish: Publish, wait_s: float = RESUBMIT_AFTER_S
) -> int:
    """After `wait_s`, publish again every request not heard about since `since`; the count sent."""
    await asyncio.sleep(wait_s)
    resent = 0
    for rid, item in list(pending.items()):
        for tries in range(1, RESUBMIT_TRIES + 1):
            if pending.get(rid) is not item or not item.silent_since(since):
                break  # finished, cancelled, or a redelivered copy spoke up meanwhile
            try:
                await publish(item)
                resent += 1
                break
            except (PublishError, DeliveryError, TimeoutError, AMQPError, OSError, RuntimeError) as exc:
                if tries == RESUBMIT_TRIES:
                    # It ends by its deadline or the outage bound, with a clear error.
                    _log.warning("could not resubmit %s: %r", rid, exc)
                else:
                    await asyncio.sleep(float(tries))
    return resent


def nack_is_full(depth: int | None, limit: int | None) -> bool:
    """Whether a nacked publish met the queue's length limit (else the queue could not take it
    now). `depth`: read just after the nack (None: the read failed too); `limit`: the length policy
    in force (None: none was set, so no nack comes from length)."""
    if limit is None or depth is None:
        return False
    return depth >= limit - max(1, limit // 10)  # consumers may have taken a few meanwhile
