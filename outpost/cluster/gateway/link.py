"""The gateway's side of the broker: `RemoteBackend`, an InferenceBackend whose engine is a fleet of workers.

`GatewayLink` owns the connection and everything one gateway process shares across models: its
reply queue, the table of live workers (from heartbeats: fleet.py), the dead-letter consumer
(verdicts.py), and the requests in flight. The gateway is the single arbiter of each request's
outcome: replies carry (request id, attempt, seq) and only the next expected batch of the current
attempt is forwarded; the tokens forwarded are remembered, so a worker that takes over a
redelivered request can ask (`resume?`) and continue exactly where the client is. A reply batch
with attempt -1 is the broker's verdict from the dead-letter queue (expired: 504; delivery limit:
poison) and always ends the request.

`submit()` refuses a request past this gateway's share of `--max-queue` at once (`QueueFull`, 429:
admission.py counts it here, the broker's length limit does not hold under concurrent publishers)
and returns only after the publisher confirm: a nack at the queue's length limit is `QueueFull`
too, no broker is `BackendUnavailable` (503) at once. Embedding jobs take the same
queue and the same answers; their one reply each is matched in `embed.EmbedCalls`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Coroutine, Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import AMQPError, DeliveryError, PublishError

from outpost import tracing
from outpost.cluster import wire, wire_embed
from outpost.cluster.broker import connection, topology
from outpost.cluster.broker.publish import request_message
from outpost.cluster.broker.session import OUTAGE_BOUND_S, BrokerSession, cancelled_here
from outpost.cluster.embed import EmbedCalls
from outpost.cluster.gateway import admission
from outpost.cluster.gateway.depths import QueueDepths
from outpost.cluster.gateway.fleet import WorkerTable
from outpost.cluster.gateway.inflight import (
    LOST_REPLIES_GRACE_S,
    Pending,
    nack_is_full,
    resubmit,
    resume_answer,
    silent_since,
)
from outpost.cluster.gateway.routing import Route, Router
from outpost.cluster.gateway.verdicts import BROKER_VERDICT, DEADLINE_GRACE_S, answer_dead, last_resort
from outpost.messages import BackendUnavailable, GenerateRequest, QueueFull, TokenEvent

_log = logging.getLogger("outpost.cluster.gateway")

PUBLISH_TIMEOUT_S = 5.0
REPLY_PREFETCH = 256  # reply messages unacked at once (one ack each, no round trip)


async def _never_called(message: AbstractIncomingMessage) -> None:
    await message.ack()  # nothing is published to a presence queue; were something, it goes


class GatewayLink:
    """One gateway process's broker connection, reply queue, worker table and requests in flight."""

    def __init__(
        self,
        url: str | Sequence[str],
        models: list[str],
        gateway_id: str | None = None,
        prefix_routing: bool = True,
        quorum_size: int | None = None,
        max_queue: int | None = None,
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)  # a cluster's nodes: any will do
        self.url = self.urls[0]
        self.quorum = topology.quorum_size(len(self.urls), quorum_size)  # replicas of its queues
        self.models = list(models)
        self.gateway_id = gateway_id or uuid.uuid4().hex[:12]
        self.reply_name = topology.reply_queue(self.gateway_id)
        self.pending: dict[str, Pending] = {}
        self.fleet = WorkerTable(self.models)
        self.queues = QueueDepths(self.models)
        self.depths = self.queues.depths  # the request queues' depths, polled (depths.py)
        self.counters = {
            "resumes": 0,
            "resubmitted": 0,  # requests in flight sent again after this gateway's link was lost
            "duplicates": 0,
            "dead_lettered": 0,
            "routed_prefix": 0,  # to the lane of the worker holding the prompt's prefix
            "routed_placed": 0,  # to the lane of the worker a new long prefix hashes to
            "routed_shared": 0,
            "lane_full": 0,  # a lane nacked (its worker is backed up): sent to the shared queue
        }
        self.routers = {m: Router(topology.request_queue(m), prefix_routing) for m in self.models}
        self.embeds = EmbedCalls(PUBLISH_TIMEOUT_S, DEADLINE_GRACE_S)
        self.outage_bound_s = OUTAGE_BOUND_S  # past this long without the broker, requests end
        # The request queues' length limit (--max-queue, set by a policy): a nack at it is a full
        # queue (429), below it the broker could not take the message now (503). None: never full.
        self.max_queue = max_queue
        self.gateways = self.queues.gateways  # gateways serving each model: the bound's share
        self._conn: AbstractConnection | None = None
        self._session: BrokerSession | None = None
        self._run: asyncio.Future[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._jobs: set[asyncio.Task[None]] = set()  # fire-and-forget publishes, kept referenced
        self.lost_replies_grace_s = LOST_REPLIES_GRACE_S  # inflight.py; tests shorten it

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, connect_timeout: float = 30.0) -> None:
        """Connect and declare; raises BackendUnavailable if the broker does not answer in time.
        The session then keeps the link up: after a loss it connects again and sets up afresh."""
        self._session = BrokerSession(
            self.urls, f"outpost-gateway {self.gateway_id}", self._setup, self._on_lost
        )
        self._run = asyncio.ensure_future(self._session.run())
        first = asyncio.ensure_future(self._session.connected.wait())
        await asyncio.wait({first, self._run}, timeout=connect_timeout, return_when=asyncio.FIRST_COMPLETED)
        if not first.done():
            first.cancel()
            if self._run.done():
                await self._run  # raises what stopped it (BrokerTLSError)
            self._run.cancel()
            raise BackendUnavailable(f"broker unreachable at {connection.redact(self.url)}")
        polls = self.queues.poll(lambda: self.connected)
        self._tasks = [asyncio.ensure_future(polls), asyncio.ensure_future(self._expire())]

    async def _setup(self, conn: AbstractConnection) -> None:
        """Everything on a new connection: channels, declares, consumers (fresh tags every time)."""
        session = self._session
        assert session is not None  # set by start(), which runs the session
        pub = session.essential(await conn.channel(publisher_confirms=True, on_return_raises=True))
        control, status = await topology.declare_common(conn, pub, self.quorum)
        presence = session.essential(await conn.channel())
        await presence.set_qos(prefetch_count=1)
        for model in self.models:
            await topology.declare_request_queue(conn, pub, model, self.quorum)
            await topology.declare_resume_queue(conn, pub, model, self.quorum)
            gateways = await topology.declare_gateways_queue(conn, presence, model, self.quorum)
            await gateways.consume(_never_called)  # counted, never fed (admission.py)
        side = session.essential(await conn.channel())
        # Outlives this connection (topology), and acked: what the broker pushed into a link that
        # was already cut comes back to the queue with the connection, so a cut loses no reply.
        # Only a reconnect can find it gone (`connections` counts the setups that succeeded).
        lost = session.connections > 0 and not await topology.queue_exists(conn, self.reply_name)
        reply_ch = session.essential(await conn.channel())
        await reply_ch.set_qos(prefetch_count=REPLY_PREFETCH)
        replies = await reply_ch.declare_queue(self.reply_name, arguments=topology.reply_arguments())
        if lost:  # with what it held: the last replies of requests whose workers are done with them
            self._background(self._resend_silent(time.monotonic()))
        await replies.consume(self._on_reply)
        status_q = await side.declare_queue(
            f"outpost.status.{self.gateway_id}", exclusive=True, auto_delete=True
        )
        await status_q.bind(status)
        await status_q.consume(self._on_status, no_ack=True)
        dead_ch = session.essential(await conn.channel())
        await dead_ch.set_qos(prefetch_count=16)
        dead = await dead_ch.declare_queue(topology.DEAD_QUEUE, passive=True)  # declare_common's
        await dead.consume(self._on_dead)
        self._conn, self._pub, self._control, self._side = conn, pub, control, side
        await self.queues.attach(conn)
        await (await topology.declare_parked(dead_ch, self.reply_name, self.quorum)).consume(self._on_parked)

    async def _on_parked(self, message: AbstractIncomingMessage) -> None:
        """A request a worker handed back: it could not reach this gateway's reply queue."""
        async with message.process(ignore_processed=True):
            pending = self.pending.get(message.correlation_id or "")
            if pending is not None and pending.needs_resubmit():
                self._background(self._resend(pending, "a worker could not reply to it and handed it back"))

    async def _resend(self, pending: Pending, why: str) -> None:
        """Send a request the broker lost again (inflight.py); its taker resumes it."""
        _log.warning("gateway %s: resubmitting %s: %s", self.gateway_id, pending.request.request_id, why)
        if await resubmit(self.pending, pending, self._resubmit):
            self.counters["resubmitted"] += 1

    async def _resend_silent(self, since: float) -> None:
        await asyncio.sleep(self.lost_replies_grace_s)
        for pending in silent_since(self.pending, since):
            if pending.needs_resubmit():
                await self._resend(pending, "its reply queue was lost with the broker; no worker holds it")

    async def _resubmit(self, pending: Pending) -> None:
        """The worker that takes it asks `resume?` and continues from what the client has. One a
        worker had started goes to the resume queue, which workers run before any waiting request."""
        request = pending.request
        time_left = None if request.deadline is None else max(request.deadline - time.monotonic(), 0.001)
        body = wire.encode_request(request, resubmitted=True)
        name = topology.resume_queue if pending.started else topology.request_queue
        await self._publish(name(pending.model), body, request, time_left)

    async def _on_lost(self) -> None:
        self._conn = None
        self.queues.detach()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._run is not None:
            self._run.cancel()
            await asyncio.wait({self._run}, timeout=10)
        if self._session is not None:
            await self._session.close()

    @property
    def connected(self) -> bool:
        return self._session is not None and self._session.connected.is_set() and self._conn is not None

    # -- requests -------------------------------------------------------------------------------

    async def submit(self, model: str, request: GenerateRequest) -> Pending:
        """Publish to the queue routing chooses (a worker's lane or the shared queue), confirmed."""
        if not self.connected:
            raise BackendUnavailable("the message broker is unreachable; retry later", retry_after=2.0)
        self._admit(model)
        rid = request.request_id
        pending = Pending(request, model)
        self.pending[rid] = pending  # before the publish: a fast worker may reply first
        now = time.monotonic()
        time_left = None if request.deadline is None else max(request.deadline - now, 0.001)
        router = self.routers[model]
        route, hashes = router.route(request.prompt_tokens, self.fleet.views(model), now, time_left)
        body = wire.encode_request(request)
        try:
            if route.worker_id is not None and await self._publish_to_lane(route, body, request, time_left):
                router.published(route, hashes, now)
                self.counters["routed_" + route.reason] += 1
                return pending
            await self._publish(topology.request_queue(model), body, request, time_left)
            self.counters["routed_shared"] += 1
        except PublishError as exc:  # returned: the queue does not exist (deleted under us)
            self.pending.pop(rid, None)
            raise BackendUnavailable(f"no queue for model {model}") from exc
        except DeliveryError as exc:  # nacked: at the length limit, or the queue has no leader now
            self.pending.pop(rid, None)
            if nack_is_full(await self.queues.fresh(model), self.max_queue):
                raise QueueFull(f"the queue for {model} is full; retry later") from exc
            raise BackendUnavailable(
                f"the message broker could not take the request for {model} now; retry later",
                retry_after=2.0,
            ) from exc
        except (TimeoutError, AMQPError, OSError, RuntimeError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and cancelled_here():
                raise  # the client went away (its cancel follows): not the link's doing
            self.pending.pop(rid, None)
            # No confirm (a timeout, or the connection went): the broker may still have taken it.
            # The client gets its 503 now, so no worker should spend a slot on it (workers
            # remember early cancels); sent once the link is back.
            self._background(self._publish_cancel(rid, wait=True))
            raise BackendUnavailable(
                "the message broker is unreachable; retry later", retry_after=2.0
            ) from exc
        return pending

    def _admit(self, model: str) -> None:
        """Raise QueueFull when this gateway's share of --max-queue already waits (admission.py)."""
        if admission.full(
            self.pending.values(), model, self.max_queue, self.gateways[model], len(self.embeds)
        ):
            raise QueueFull(f"the queue for {model} is full; retry later")

    def _background(self, job: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(job)
        self._jobs.add(task)
        task.add_done_callback(self._jobs.discard)

    async def _publish_to_lane(
        self, route: Route, body: bytes, request: GenerateRequest, time_left: float | None
    ) -> bool:
        """True when the lane took it; False when it is full or gone (then the shared queue will)."""
        expiration = route.window_s if time_left is None else min(route.window_s or time_left, time_left)
        try:
            await self._publish(route.queue, body, request, expiration)
            return True
        except (DeliveryError, PublishError):
            self.counters["lane_full"] += 1
            return False

    async def _publish(
        self, queue: str, body: bytes, request: GenerateRequest, expiration: float | None
    ) -> None:
        headers: dict[str, Any] = {}
        tracing.inject(headers, tracing.current.get())  # the HTTP request's span, when traced
        message = request_message(body, request.request_id, self.reply_name, headers, expiration)
        await self._pub.default_exchange.publish(
            message, routing_key=queue, mandatory=True, timeout=PUBLISH_TIMEOUT_S
        )

    async def embed(self, model: str, job: wire_embed.EmbedJob) -> wire_embed.EmbedReply:
        """Publish an embedding job to the model's queue and wait for a worker's reply."""
        if not self.connected:
            raise BackendUnavailable("the message broker is unreachable; retry later", retry_after=2.0)
        self._admit(model)
        return await self.embeds.call(self._pub, topology.request_queue(model), self.reply_name, job)

    async def cancel(self, request_id: str) -> None:
        """The client went away: tell every worker (whichever holds it aborts it)."""
        pending = self.pending.pop(request_id, None)
        if pending is None or pending.finished:
            return
        await self._publish_cancel(request_id)

    async def _publish_cancel(
        self, request_id: str, wait: bool = False, before_attempt: int | None = None
    ) -> None:
        if wait and self._session is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._session.connected.wait(), OUTAGE_BOUND_S)
        if not self.connected:
            return
        with contextlib.suppress(AMQPError, OSError, RuntimeError, asyncio.TimeoutError):
            await self._control.publish(
                aio_pika.Message(wire.encode_cancel(request_id, before_attempt)),
                routing_key="",
                mandatory=False,
                timeout=5,
            )

    def _deliver(self, pending: Pending, events: list[TokenEvent]) -> None:
        for event in events:
            if pending.finished:
                return
            pending.sent += event.token_ids
            pending.finished = event.finished
            pending.events.put_nowait(event)
        if pending.finished:
            self.pending.pop(pending.request.request_id, None)

    async def _on_reply(self, message: AbstractIncomingMessage) -> None:
        try:
            await self._read_reply(message)
        finally:
            with contextlib.suppress(AMQPError, OSError, RuntimeError):
                await message.ack()

    async def _read_reply(self, message: AbstractIncomingMessage) -> None:
        try:
            fields = wire.loads(message.body, wire.KINDS)  # parsed once per reply message
            kind = fields["kind"]
            if kind == "resume?":
                await self._answer_resume(message)
                return
            if kind == "embedded":
                self.embeds.on_reply(wire_embed.decode_embed_reply(message.body))
                return
            if kind not in ("events", "bundle"):
                raise wire.WireError(f"a {kind} message does not belong on a reply queue")
            batches = wire.decode_bundle(fields) if kind == "bundle" else [wire.decode_batch(fields)]
        except wire.WireError as exc:
            _log.warning("ignoring a reply: %s", exc)
            return
        for batch in batches:
            self._on_batch(batch)

    def _on_batch(self, batch: wire.ReplyBatch) -> None:
        pending = self.pending.get(batch.request_id)
        if pending is None:
            if batch.attempt == BROKER_VERDICT:
                self.embeds.on_verdict(batch)  # an embedding job the broker gave up on
            return  # cancelled or already finished
        if batch.attempt == BROKER_VERDICT:
            self.counters["dead_lettered"] += 1  # counted by the gateway whose client it tells
            self._deliver(pending, [e for e in batch.events if e.finished][:1])
        elif batch.attempt == pending.attempt and batch.seq == pending.next_seq:
            pending.next_seq += 1
            pending.heard = time.monotonic()
            self._deliver(pending, batch.events)
        elif batch.attempt == pending.attempt and batch.seq > pending.next_seq and pending.needs_resubmit():
            # The broker lost replies of this copy (a reply queue gone with its node): the copy
            # that takes it again resumes from what the client has, and the old one is stopped.
            why = f"replies {pending.next_seq}..{batch.seq - 1} of attempt {batch.attempt} were lost"
            self._background(self._resend(pending, why))
        else:
            self.counters["duplicates"] += 1  # a late batch of an attempt that was taken over

    async def _answer_resume(self, message: AbstractIncomingMessage) -> None:
        query = wire.decode_resume_query(message.body)
        pending = self.pending.get(query.request_id)
        state, new = resume_answer(pending, query)
        if new:
            self.counters["resumes"] += 1
            # A copy of an older attempt may still run (a cut link it never noticed): stop it.
            self._background(self._publish_cancel(query.request_id, before_attempt=state.attempt))
        rid = query.request_id
        if message.reply_to:
            with contextlib.suppress(AMQPError, OSError, RuntimeError, asyncio.TimeoutError):
                await self._pub.default_exchange.publish(
                    aio_pika.Message(wire.encode_resume(state), correlation_id=rid),
                    routing_key=message.reply_to,
                    mandatory=False,
                    timeout=5,
                )

    async def _on_dead(self, message: AbstractIncomingMessage) -> None:
        """A request the broker gave up on: send its one final error to its gateway (verdicts.py)."""
        session = self._session  # set before the first _setup, which starts this consumer
        since = session.since_connected if session is not None else (lambda: math.inf)
        await answer_dead(message, lambda: self._pub.default_exchange, since)

    async def _on_status(self, message: AbstractIncomingMessage) -> None:
        hb = self.fleet.heard(message.body)
        if hb is not None and hb.model in self.routers:
            self.routers[hb.model].heartbeat(hb.worker_id)

    # -- background -----------------------------------------------------------------------------

    async def _expire(self) -> None:
        """A last resort for a final reply that never comes: past a request's deadline (e.g. a
        dead-letter lost with its broker), or the broker unreachable for OUTAGE_BOUND_S (verdicts.py)."""
        while True:
            await asyncio.sleep(1.0)
            now = time.monotonic()
            outage = self._session is not None and self._session.down_for() > self.outage_bound_s
            for pending in list(self.pending.values()):
                event = last_resort(pending.request, now, self.outage_bound_s if outage else None)
                if event is not None:
                    self._deliver(pending, [event])

    # -- the live workers (fleet.py) ------------------------------------------------------------

    def n_ctx_seq(self, model: str) -> int | None:
        return self.fleet.n_ctx_seq(model)

    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        return self.fleet.live_workers(model)
