"""Embeddings through the broker: the gateway's jobs in flight and the worker's answer to one.

An embedding job travels like a chat request: persistent, on the model's request queue, with the
request's deadline as its expiration, acked by the worker only once its reply is confirmed. It is
simpler in two ways. It has one reply (the vectors, or why there are none), not a stream. And it
is idempotent: a worker that dies while holding one leaves it unacked, the broker redelivers it,
and the next worker just computes it again; no `resume?`. The gateway takes the first reply for a
job and drops any other. A job the broker gives up on (expired in the queue, or past the delivery
limit) comes back as the dead-letter consumer's final error batch, which ends the call too.

On the gateway, a reply turns into what `LocalBackend.embed` raises on `outpost serve`, so the
route answers the same: ValueError (400), BackendUnavailable (503), RuntimeError (500), and
TimeoutError (504, the gateway's deadline; serve has none).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractIncomingMessage
from aiormq.exceptions import AMQPError, DeliveryError, PublishError

from outpost.cluster import wire
from outpost.cluster.wire_embed import (
    EmbedFailure,
    EmbedJob,
    EmbedReply,
    decode_embed_job,
    encode_embed_job,
    encode_embed_reply,
)
from outpost.messages import BackendUnavailable, FinishReason, QueueFull

_log = logging.getLogger("outpost.cluster.embed")

Vectors = tuple[list[list[float]], int]  # one vector per text, and the tokens read
EmbedFn = Callable[[list[str]], Awaitable[Vectors]]

REPLY_TIMEOUT_S = 30.0


# -- gateway ------------------------------------------------------------------------------------


class EmbedCalls:
    """A gateway's embedding jobs waiting for their reply, by request id."""

    def __init__(self, publish_timeout: float, grace: float) -> None:
        self.publish_timeout = publish_timeout
        self.grace = grace  # past its deadline plus this, a job with no reply times out here
        self._waiting: dict[str, asyncio.Future[EmbedReply]] = {}

    def __len__(self) -> int:
        return len(self._waiting)

    async def call(self, channel: AbstractChannel, queue: str, reply_to: str, job: EmbedJob) -> EmbedReply:
        """Publish `job` to `queue` and wait for its reply; raises QueueFull / BackendUnavailable."""
        future: asyncio.Future[EmbedReply] = asyncio.get_running_loop().create_future()
        self._waiting[job.request_id] = future  # before the publish: a fast worker may reply first
        try:
            await self._publish(channel, queue, reply_to, job)
            return await self._wait(future, job)
        finally:
            self._waiting.pop(job.request_id, None)

    def on_reply(self, reply: EmbedReply) -> bool:
        """A worker's reply; False when nobody waits for it (a late copy, or the client left)."""
        future = self._waiting.get(reply.request_id)
        if future is None or future.done():
            return False
        future.set_result(reply)
        return True

    def on_verdict(self, batch: wire.ReplyBatch) -> bool:
        """The dead-letter consumer's final error for a job the broker gave up on."""
        final = next((e for e in batch.events if e.finished), None)
        if final is None:
            return False
        expired = final.finish_reason is FinishReason.TIMEOUT
        failure = EmbedFailure.TIMEOUT if expired else EmbedFailure.ENGINE
        return self.on_reply(EmbedReply(batch.request_id, failure=failure, error=final.error))

    async def _publish(self, channel: AbstractChannel, queue: str, reply_to: str, job: EmbedJob) -> None:
        expiration = None if job.deadline is None else max(job.deadline - time.monotonic(), 0.001)
        message = aio_pika.Message(
            encode_embed_job(job),
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            correlation_id=job.request_id,
            message_id=job.request_id,
            reply_to=reply_to,
            expiration=expiration,
        )
        # The same answers as a chat request's publish (GatewayLink.submit).
        try:
            await channel.default_exchange.publish(
                message, routing_key=queue, mandatory=True, timeout=self.publish_timeout
            )
        except PublishError as exc:  # returned: the queue does not exist (deleted under us)
            raise BackendUnavailable(f"no queue {queue}") from exc
        except DeliveryError as exc:  # nacked: reject-publish at the queue's length limit
            raise QueueFull(f"the queue {queue} is full; retry later") from exc
        except (TimeoutError, AMQPError, OSError, RuntimeError) as exc:
            raise BackendUnavailable(
                "the message broker is unreachable; retry later", retry_after=2.0
            ) from exc

    async def _wait(self, future: asyncio.Future[EmbedReply], job: EmbedJob) -> EmbedReply:
        if job.deadline is None:
            return await future
        try:
            return await asyncio.wait_for(future, max(job.deadline - time.monotonic(), 0.0) + self.grace)
        except TimeoutError:  # a last resort: the broker's verdict should have come first
            return EmbedReply(job.request_id, failure=EmbedFailure.TIMEOUT, error="no reply")


def vectors_of(reply: EmbedReply) -> Vectors:
    """The reply's vectors, or what `outpost serve`'s embed would have raised instead."""
    error = reply.error or "the embedding failed"
    if reply.failure is None:
        return reply.vectors, reply.n_tokens
    if reply.failure is EmbedFailure.INPUT:
        raise ValueError(error)
    if reply.failure is EmbedFailure.UNAVAILABLE:
        raise BackendUnavailable(error)
    if reply.failure is EmbedFailure.TIMEOUT:
        raise TimeoutError(error)
    raise RuntimeError(error)


# -- worker -------------------------------------------------------------------------------------


async def answer(message: AbstractIncomingMessage, embed: EmbedFn, exchange: AbstractExchange) -> None:
    """Compute one job and reply; ack only after the reply is confirmed (or cannot be routed)."""
    try:
        job = decode_embed_job(message.body)
    except wire.WireError as exc:
        _log.error("dropping an unreadable embedding job: %s", exc)
        await message.reject(requeue=False)  # dead-lettered: the gateway answers it
        return
    if message.reply_to is None:
        await message.ack()
        return
    reply = await compute(job, embed)
    body = encode_embed_reply(reply)
    with contextlib.suppress(PublishError):  # unroutable: its gateway is gone, nobody to answer
        await exchange.publish(
            aio_pika.Message(body, correlation_id=job.request_id),
            routing_key=message.reply_to,
            mandatory=True,
            timeout=REPLY_TIMEOUT_S,
        )
    await message.ack()


async def compute(job: EmbedJob, embed: EmbedFn) -> EmbedReply:
    """The job's vectors, or the failure `outpost serve` would have answered with."""
    rid = job.request_id
    if job.deadline is not None and job.deadline <= time.monotonic():
        return EmbedReply(rid, failure=EmbedFailure.TIMEOUT, error="deadline passed in the queue")
    try:
        vectors, n_tokens = await embed(job.texts)
    except ValueError as exc:  # a text longer than the embedding context
        return EmbedReply(rid, failure=EmbedFailure.INPUT, error=str(exc))
    except BackendUnavailable as exc:
        return EmbedReply(rid, failure=EmbedFailure.UNAVAILABLE, error=str(exc))
    except RuntimeError as exc:
        return EmbedReply(rid, failure=EmbedFailure.ENGINE, error=str(exc))
    return EmbedReply(rid, vectors, n_tokens)
