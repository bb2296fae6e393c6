"""How a request ends when no worker ends it: the broker's verdict, or the gateway's last resort.

Every gateway consumes `outpost.dead` (topology.DEAD_QUEUE) and answers for whichever gateway a
dead-lettered request came from (`answer_dead`): expired in the queue is a timeout (504), past the
delivery limit is poison (an error), anything else was dropped by the broker. The answer is a reply batch
with attempt `BROKER_VERDICT`, which always ends the request at its gateway. A reply queue that is not
there soon after a reconnect may be its gateway declaring it again: the answer is sent again meanwhile
(broker/publish.py), the dead letter unacked until then. `last_resort` is the gateway's own final event
for a request whose final reply never comes: past its deadline plus DEADLINE_GRACE_S (e.g. a dead letter
lost with its broker), or the broker unreachable for too long.
"""

from __future__ import annotations

from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage

from outpost.cluster import wire
from outpost.cluster.broker import topology
from outpost.cluster.broker.publish import publish_to_gateway
from outpost.messages import FinishReason, GenerateRequest, TokenEvent

BROKER_VERDICT = -1  # the attempt number of a dead-letter queue's final reply
DEADLINE_GRACE_S = 5.0  # past its deadline plus this, a request with no final reply times out here


async def answer_dead(
    message: AbstractIncomingMessage,
    exchange: Callable[[], AbstractExchange],
    since_connected: Callable[[], float],
) -> None:
    """Send a dead-lettered request's one final error to its gateway's reply queue, then ack.
    `exchange` gives the exchange to publish on (read only when there is an answer to send)."""
    headers = message.headers or {}
    reason = str(headers.get("x-first-death-reason", "rejected"))
    rid = message.correlation_id or ""
    if reason == "expired":
        final = TokenEvent(
            rid, finish_reason=FinishReason.TIMEOUT, error="the request's deadline passed in the queue"
        )
    else:
        final = TokenEvent(
            rid,
            finish_reason=FinishReason.ERROR,
            error=f"the request failed on {topology.DELIVERY_LIMIT + 1} workers and was given up (poison)"
            if reason == "delivery_limit"
            else f"the request was dropped by the broker ({reason})",
        )
    if message.reply_to and rid:
        body = wire.encode_batch(wire.ReplyBatch(rid, BROKER_VERDICT, 0, [final]))
        reply_to = message.reply_to
        # False when its gateway is gone: nobody to tell.
        await publish_to_gateway(
            lambda: exchange().publish(
                aio_pika.Message(body, correlation_id=rid), routing_key=reply_to, mandatory=True, timeout=10
            ),
            since_connected,
        )
    await message.ack()


def last_resort(request: GenerateRequest, now: float, outage_s: float | None) -> TokenEvent | None:
    """The gateway's own final event for `request`, or None (wait on): `outage_s` is the outage bound
    when the broker has been unreachable for longer, else None."""
    if outage_s is not None:
        error = f"the message broker has been unreachable for more than {outage_s:g} s"
        return TokenEvent(request.request_id, finish_reason=FinishReason.ERROR, error=error)
    if request.deadline is not None and now > request.deadline + DEADLINE_GRACE_S:
        return TokenEvent(request.request_id, finish_reason=FinishReason.TIMEOUT, error="no reply")
    return None
