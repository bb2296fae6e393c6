"""Resuming a request another worker had started: is it a redelivery, what does its client have,
and the request that continues from there.

A worker that dies leaves its unacked requests to the broker, which delivers them again (here or
to another worker). Such a copy may have sent tokens already, so before running it the worker asks
the gateway named in `reply_to` what the client already has (`resume?` on the gateway's reply
queue, answered on the worker's private queue) and runs the prompt plus those tokens (`continued`).
A request on the resume queue that never started (a lane's spill) is sent on to the shared queue
(`forward`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractExchange, AbstractIncomingMessage
from aiormq.exceptions import DeliveryError, PublishError

from outpost.cluster import wire
from outpost.cluster.broker import topology
from outpost.cluster.broker.publish import publish_to_gateway, request_message
from outpost.messages import GenerateRequest

RESUME_TIMEOUT_S = 10.0  # no answer to any of the repeats: the request goes back to the broker
RESUME_RETRY_S = 1.0  # asked again this often: answered within about a second of the gateway's return


class ResumeUnanswered(Exception):
    """A gateway took the resume query but sent no answer: the request goes back to the broker."""


class ResumesFirst:
    """Holds a worker's fresh requests back while requests it is resuming have not reached its
    engine yet (their `resume?` is a round trip): the interrupted ones take the free slots first.
    A fresh request waits at most RESUME_TIMEOUT_S, a question's own bound."""

    def __init__(self) -> None:
        self._open: set[str] = set()
        self._none = asyncio.Event()
        self._none.set()

    def hold(self, rid: str) -> None:
        self._open.add(rid)
        self._none.clear()

    def release(self, rid: str) -> None:
        """`rid` is in the engine, or will not be resumed here (idempotent)."""
        self._open.discard(rid)
        if not self._open:
            self._none.set()

    async def settled(self) -> None:
        if self._none.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._none.wait(), RESUME_TIMEOUT_S)


def continued(request: GenerateRequest, sent: list[int]) -> GenerateRequest:
    """The rest of a request whose first tokens the client already has.

    Those tokens go on the prompt and are marked as output (`n_resumed`): the engine counts them
    against max_tokens and primes its stop-string and UTF-8 hold-back with their text."""
    return dataclasses.replace(
        request,
        prompt_tokens=request.prompt_tokens + sent,
        n_resumed=request.n_resumed + len(sent),
    )


def delivery_count(message: AbstractIncomingMessage) -> int:
    """Earlier deliveries of this message (quorum queues count them in x-delivery-count)."""
    count = (message.headers or {}).get("x-delivery-count")
    if isinstance(count, int):
        return count
    return 1 if message.redelivered else 0


def may_have_started(message: AbstractIncomingMessage) -> bool:
    """Some worker may have sent tokens of this request: it was delivered before, here or in a
    lane whose worker died (a lane dead-letters such a request at once, as "delivery_limit")."""
    if delivery_count(message) > 0:
        return True
    deaths = (message.headers or {}).get("x-death")
    return isinstance(deaths, list) and any(
        isinstance(d, dict) and d.get("reason") == "delivery_limit" for d in deaths
    )


async def park(exchange: AbstractExchange, body: bytes, rid: str, reply_to: str) -> bool:
    """Hand a request back to the gateway at `reply_to` through its parked queue (broker/topology.py): its
    reply queue is not there (gone with its node, or expired), and the gateway sends the request
    again once it is back. False when that queue is not there either: the gateway is gone for good."""
    parked = aio_pika.Message(body, correlation_id=rid, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    try:
        await exchange.publish(
            parked, routing_key=topology.parked_queue(reply_to), mandatory=True, timeout=10
        )
    except PublishError:
        return False
    return True


async def forward(
    exchange: AbstractExchange, message: AbstractIncomingMessage, body: bytes, queue: str
) -> bool:
    """Send a request from the resume queue that streamed nothing (a lane dead-letters its expired
    requests there too) on to `queue`, the shared queue, as `body`; then ack it here. False when
    `queue` refused it (full, or gone): then it runs here."""
    headers = {k: v for k, v in (message.headers or {}).items() if not k.startswith("x-")}
    again = request_message(body, message.correlation_id, message.reply_to, headers, None)
    try:
        await exchange.publish(again, routing_key=queue, mandatory=True, timeout=10)
    except (DeliveryError, PublishError):
        return False
    await message.ack()
    return True


async def ask_resume(
    exchange: AbstractExchange,
    private_queue: str,
    rid: str,
    reply_to: str,
    answer: asyncio.Future[wire.ResumeState],
    since_connected: Callable[[], float],
) -> wire.ResumeState | None:
    """What the client of `rid` already has, asked of the gateway at `reply_to`; `answer` is set by
    whoever reads `private_queue`. None when the gateway cannot be reached (unroutable once this
    worker has been connected for GATEWAY_GRACE_S: before that its reply queue may still be coming
    back). The question is asked again every RESUME_RETRY_S until answered (a query the broker took
    while the gateway was reconnecting may have gone to a reply queue on a dead node): the gateway
    answers one asker's repeats alike. Raises ResumeUnanswered after RESUME_TIMEOUT_S without one."""
    asker = uuid.uuid4().hex[:12]
    query = wire.encode_resume_query(rid, asker)
    deadline: float | None = None

    async def ask() -> None:
        message = aio_pika.Message(query, reply_to=private_queue, correlation_id=rid)
        await exchange.publish(message, routing_key=reply_to, mandatory=True, timeout=10)

    while True:
        if not await publish_to_gateway(ask, since_connected):
            return None  # unroutable: its gateway is gone
        if deadline is None:  # from the first question a gateway that is there took
            deadline = time.monotonic() + RESUME_TIMEOUT_S
        left = deadline - time.monotonic()
        if left <= 0:
            raise ResumeUnanswered(rid)
        try:
            return await asyncio.wait_for(asyncio.shield(answer), min(RESUME_RETRY_S, left))
        except TimeoutError:
            continue
