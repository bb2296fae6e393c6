"""`Worker` (`outpost worker`): takes requests from RabbitMQ, runs them on its backend, streams replies.

The backend is an `InferenceBackend` (outpost/backend.py), the seam `outpost serve`'s API uses:
`LocalBackend` in `outpost worker`, a fake in tests. Its heartbeat reports what the backend says: its
slots, KV cells and positions per request (`n_ctx_seq`, which gateways admit by), and the hash of its
chat template. A request the backend refuses as too long for its context ends with the 400 serve would
have answered, carried in the final event (`TokenEvent.error_param`).

Pull balancing: the worker reads the model's shared queue and its own lane (requests a gateway routed to
it for the prefix its KV holds) through exactly one single-message consumer per slot (intake.py), so it
never holds more unacked requests than it can run; the rest wait in the broker. Its heartbeat says its
load, its lane, and the block hashes of what its slots hold (prefix.py), which is what gateways route by.
Each request runs in `requests.BackendRequests`: its events (its backend's `EventStream`) are gathered
while the previous reply's publisher confirm is awaited (`outbox.step_batches`), so a request sends at
most one message per engine step (and fewer when steps are faster than a broker round trip); the batches
of all requests bound for one gateway travel together, one bundle per confirm (outbox.py). Replies go to
the gateway's queue with `mandatory`: one the broker cannot route means the gateway is gone, and the
request is aborted. A request is acked only once its final reply is confirmed, so a worker that dies
leaves it to the broker to redeliver; the next worker asks the gateway what the client already has
(`resume?`) and continues from the prompt plus those tokens. Embedding jobs come on the same queue and
are answered by `embed.answer` (one reply; a redelivered one is computed again).

Several models (`outpost worker --models-dir`, or the store's): each is a `ServedModel` (served.py)
with its own shared queue, lane, credits and heartbeat, all on one connection; a pooled model loads on
its first request (the request waits, bounded by `--model-load-timeout`; past that it ends with the
pool's reason as its error, as a request the backend refuses does).

Decoding runs on the backend's engine thread; this event loop only moves messages (AMQP heartbeats keep
flowing during long prefills). Gateways' cancels and their answers to `resume?` arrive on two side
channels (control.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage, AbstractQueue
from aiormq.exceptions import AMQPError, ChannelInvalidStateError, PublishError

from outpost import tracing
from outpost.backend import InferenceBackend
from outpost.cluster import embed, wire
from outpost.cluster.broker import topology
from outpost.cluster.broker.session import BrokerSession, cancelled_here, survive_connection_loss
from outpost.cluster.heartbeat import encode_heartbeat
from outpost.cluster.worker.cancels import CancelMemory
from outpost.cluster.worker.control import SideChannels
from outpost.cluster.worker.intake import LANE, SHARED, Intake
from outpost.cluster.worker.outbox import Outboxes
from outpost.cluster.worker.requests import BackendRequests, final_without_running
from outpost.cluster.worker.resume import (
    ResumesFirst,
    ResumeUnanswered,
    continued,
    forward,
    may_have_started,
    park,
)
from outpost.cluster.worker.served import ServedModel
from outpost.messages import GenerateRequest

if TYPE_CHECKING:
    from outpost.tracing import Tracer

_log = logging.getLogger("outpost.cluster.worker")

LOST_DRAIN_S = 30.0  # the requests of a lost connection end within an engine step of their abort


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    """One process's consumer of `outpost.req.<model>` (of each of its models) on InferenceBackends."""

    def __init__(
        self,
        url: str | Sequence[str],
        model: str | Sequence[ServedModel],
        backend: InferenceBackend | None = None,
        worker_id: str | None = None,
        tracer: Tracer | None = None,
        quorum_size: int | None = None,
    ) -> None:
        """model and backend: the one model served; or `model` lists the models (then no backend)."""
        self.urls = [url] if isinstance(url, str) else list(url)  # a cluster's nodes: any will do
        self.quorum = topology.quorum_size(len(self.urls), quorum_size)  # replicas of its queues
        self.tracer = tracer
        if isinstance(model, str):
            assert backend is not None, "one model needs its backend"
            model = [ServedModel.of(model, backend)]
        self.served = {m.name: m for m in model}
        first = model[0]
        self.model, self.backend = first.name, first.backend
        self.slots = sum(m.slots for m in model)  # fixed for the engines' life: the intakes' credits
        self.worker_id = worker_id or default_worker_id()
        self._cancels = CancelMemory()
        self._side = SideChannels(self.worker_id, self._cancels, self.served)
        self._first = ResumesFirst()
        self._draining = False
        self.completed = 0
        self._watches: list[asyncio.Future[None]] = []
        self._held = 0
        self.max_held = 0  # the most credit-delivered requests held at once (never more than its slots)
        self._conn: AbstractConnection | None = None
        self._session = BrokerSession(self.urls, "", self._setup)  # replaced by run()'s
        self._outboxes = Outboxes(self._publish_reply)
        for m in model:
            m.named_for(self.worker_id)
            m.requests = BackendRequests(
                m.backend, self.worker_id, self._cancels, lambda: self._session.since_connected()
            )
        self.lane = first.lane

    @property
    def in_flight(self) -> int:
        """Requests this worker holds (delivered, not yet acked)."""
        return sum(m.in_flight for m in self.served.values())

    def _intakes(self) -> list[Intake]:
        return [m.intake for m in self.served.values() if m.intake is not None]

    def _tasks(self) -> set[asyncio.Task[None]]:
        return {task for intake in self._intakes() for task in intake.tasks}

    # -- lifecycle ------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then stop consuming and finish what is in flight.

        The broker session sets everything up again after every lost connection (`_on_lost` drops
        what the old one delivered: the broker redelivers it, and it resumes where its client is)."""
        session = BrokerSession(self.urls, f"outpost-worker {self.worker_id}", self._setup, self._on_lost)
        self._session = session
        running = asyncio.ensure_future(session.run())
        heartbeats = asyncio.ensure_future(self._heartbeats())
        try:
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({stopped, running}, return_when=asyncio.FIRST_COMPLETED)
            if running.done():
                stopped.cancel()
                await running  # raises what ended it (BrokerTLSError)
            self._draining = True
            for intake in self._intakes():
                await intake.stop()
            while self._tasks():  # in flight: finish them, ack them
                await asyncio.wait(self._tasks())
            with contextlib.suppress(
                AMQPError, RuntimeError, asyncio.TimeoutError, PublishError, AttributeError
            ):
                await self._publish_heartbeat()
            # The lane is left to its x-expires: deleting it could lose a request a gateway routed
            # here before it saw the draining heartbeat (quorum queues refuse delete-if-empty).
        finally:
            # Cancelled (not stopped): nothing this worker started may outlive it or consume again;
            # the connection closes at once, as a killed worker's does (what it held is redelivered).
            heartbeats.cancel()
            for intake in self._intakes():
                intake.abandon()
            running.cancel()
            await asyncio.wait({running}, timeout=10)
            await session.close()

    async def _setup(self, conn: AbstractConnection) -> None:
        """Everything on a new connection: channels, declares, and the intake's consumers (fresh
        consumer tags every time; the requests of the last connection have all ended by now)."""
        session = self._session
        pub = session.essential(await conn.channel(publisher_confirms=True, on_return_raises=True))
        control, self._status = await topology.declare_common(conn, pub, self.quorum)
        consume_ch = session.essential(await conn.channel())
        queues = {m.name: await self._declare_queues(conn, consume_ch, m) for m in self.served.values()}
        side = session.essential(await conn.channel())
        control_q = await side.declare_queue(
            f"outpost.control.{self.worker_id}", exclusive=True, auto_delete=True
        )
        await control_q.bind(control)
        await control_q.consume(self._side.on_control, no_ack=True)
        self._private = topology.reply_queue(f"worker.{self.worker_id}")
        private_q = await side.declare_queue(self._private, exclusive=True, auto_delete=True)
        await private_q.consume(self._side.on_private, no_ack=True)
        self._conn, self._pub = conn, pub
        self._probe = await conn.channel()  # depths only: a failed declare must not close pub or consume_ch
        resume_ch = session.essential(await conn.channel())
        for m in self.served.values():
            handle, depth = functools.partial(self._handle, m), functools.partial(self._depth, m)
            m.intake = Intake(consume_ch, queues[m.name], m.slots, handle, depth)
            resume = await topology.declare_resume_queue(conn, resume_ch, m.name, self.quorum)
            await m.intake.start(resume, functools.partial(self._handle, m, resumed=True))
            self._watches.append(asyncio.ensure_future(m.intake.watch()))
            again = " again" if session.connections else ""
            shared = queues[m.name][SHARED].name
            _log.warning("worker %s: consuming %s and %s%s", self.worker_id, shared, m.lane, again)

    async def _declare_queues(
        self, conn: AbstractConnection, channel: AbstractChannel, m: ServedModel
    ) -> dict[str, AbstractQueue]:
        """The model's shared queue and this worker's lane of it."""
        shared = await topology.declare_request_queue(conn, channel, m.name, self.quorum)
        await topology.declare_resume_queue(conn, channel, m.name, self.quorum)  # the lane's dead go there
        lane = await topology.declare_lane(channel, m.name, self.worker_id, m.slots, self.quorum)
        return {LANE: lane, SHARED: shared}

    async def _on_lost(self) -> None:
        """The connection went: what it delivered can no longer be acked, and the broker gives it
        again (here or to another worker, whose `resume?` continues it). End it all before the next
        setup consumes, so this worker never holds more requests than it has slots."""
        intakes = self._intakes()
        for m in self.served.values():
            m.intake = None
        watches, self._watches = self._watches, []
        for watch in watches:
            watch.cancel()
        for intake in intakes:
            intake.abandon()
        tasks = {task for intake in intakes for task in intake.tasks}
        if tasks:
            _, left = await asyncio.wait(tasks, timeout=LOST_DRAIN_S)
            if left:
                _log.error(
                    "worker %s: %d requests did not end after the connection went", self.worker_id, len(left)
                )

    async def _depth(self, m: ServedModel, source: str) -> int:
        """Ready messages in the model's lane or shared queue. Declaring the lane again renews its
        unused-expiry lease while no credit consumes it (all on the shared queue, or one slot)."""
        if self._probe.is_closed and self._conn is not None:  # a failed declare closed it
            self._probe = await self._conn.channel()
        if source == LANE:
            return await topology.lane_depth(self._probe, m.name, self.worker_id, m.slots, self.quorum)
        return await topology.request_queue_depth(self._probe, m.name)

    async def _heartbeats(self) -> None:
        while True:
            with (
                survive_connection_loss(),
                contextlib.suppress(AMQPError, RuntimeError, asyncio.TimeoutError, PublishError, OSError),
            ):
                if self._session is not None and self._session.connected.is_set():
                    await self._publish_heartbeat()
            await asyncio.sleep(topology.HEARTBEAT_S)

    async def _publish_heartbeat(self) -> None:
        """One heartbeat per model served, each naming all of them."""
        names = tuple(self.served)
        for m in self.served.values():
            hb = m.heartbeat(self.worker_id, self._draining, self.completed, names)
            message = aio_pika.Message(encode_heartbeat(hb), expiration=topology.WORKER_TTL_S)
            await self._status.publish(message, routing_key="", mandatory=False, timeout=5)

    # -- requests -------------------------------------------------------------------------------

    async def _handle(self, m: ServedModel, message: AbstractIncomingMessage, resumed: bool = False) -> None:
        """One delivery, from a credit or (`resumed`) from the resume queue, beside the credits' bound."""
        held = 0 if resumed else 1
        self._held += held  # across connections: a lost one's requests count until they have ended
        self.max_held = max(self.max_held, self._held)
        try:
            await self._serve(m, message, resumed)
        except (AMQPError, ConnectionError, ChannelInvalidStateError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and cancelled_here():
                raise
            # The connection went under it: the broker gives the request again (broker/session.py).
            _log.warning("worker %s: lost the broker while serving a request (%r)", self.worker_id, exc)
        except ResumeUnanswered as exc:
            _log.warning(
                "worker %s: no resume answer for %s; returning it to the broker", self.worker_id, exc
            )
            with contextlib.suppress(Exception):
                await message.reject(requeue=True)
        except Exception:
            _log.exception("worker %s: a request failed", self.worker_id)
            # Not acked: the broker redelivers it (and dead-letters it past the delivery limit).
            with contextlib.suppress(Exception):
                await message.reject(requeue=True)
        finally:
            self._held -= held

    async def _serve(self, m: ServedModel, message: AbstractIncomingMessage, resumed: bool = False) -> None:
        """One request message: `resumed` when it came from the resume queue."""
        try:
            fields = wire.loads(message.body, ("request", "embed"))  # parsed once: kind, request, flags
            request = None if fields["kind"] == "embed" else wire.decode_request(fields)
        except wire.WireError as exc:
            _log.error("worker %s: dropping an unreadable request: %s", self.worker_id, exc)
            await message.reject(requeue=False)  # dead-lettered: the gateway answers it
            return
        if request is None:  # an embedding job, idempotent: a redelivered one is computed again
            await embed.answer(message, m.backend.embed, self._pub.default_exchange)
            self.completed += 1
            return
        rid = request.request_id
        if message.reply_to is None or self._cancels.take_cancelled(rid):
            await message.ack()
            return
        if may_have_started(message) or wire.was_resubmitted(fields):
            self._first.hold(rid)
            try:
                await self._resume(m, message, fields, request, resumed)
            finally:
                self._first.release(rid)
            return
        if resumed and await self._pass_on(m, message, message.body):
            return  # a lane's request that spilled unstarted: it waits its turn with the others
        if self._cancels.superseded(rid):
            await message.ack()  # a first copy whose request was resumed elsewhere meanwhile
            return
        await self._first.settled()  # interrupted requests being asked about here go to the engine first
        await self._run(m, message, fields, request, 0, 0)

    async def _resume(
        self,
        m: ServedModel,
        message: AbstractIncomingMessage,
        fields: dict[str, Any],
        request: GenerateRequest,
        resumed: bool,
    ) -> None:
        """A request some worker may have started: continue it from what its client already has."""
        rid, reply_to = request.request_id, message.reply_to
        assert reply_to is not None
        exchange, since = self._pub.default_exchange, self._session.since_connected
        state = await self._side.ask_resume(exchange, self._private, rid, reply_to, since)
        if state is None:
            await self._park(message, rid, reply_to)
            return
        if state.gone:
            _log.warning(
                "worker %s: dropping redelivered %s: its gateway has it no more (finished, or its "
                "client left)",
                self.worker_id,
                rid,
            )
            await message.ack()
            return
        if resumed and not state.token_ids and await self._pass_on(m, message, wire.as_resubmitted(fields)):
            return  # it had streamed nothing: not interrupted, it waits its turn with the others
        request = continued(request, state.token_ids)
        _log.warning("worker %s: resuming %s after %d tokens", self.worker_id, rid, len(state.token_ids))
        await self._run(m, message, fields, request, state.attempt, state.seq)

    async def _run(
        self,
        m: ServedModel,
        message: AbstractIncomingMessage,
        fields: dict[str, Any],
        request: GenerateRequest,
        attempt: int,
        seq: int,
    ) -> None:
        """Run `request` on the model's backend, reply per step, and ack it once it has ended."""
        rid, reply_to = request.request_id, message.reply_to
        assert reply_to is not None and m.requests is not None
        requests = m.requests
        await requests.end_stale_copy(rid)
        final = final_without_running(request)
        if final is not None:
            await self._reply(reply_to, wire.ReplyBatch(rid, attempt, seq, [final]))
        else:
            with self._outboxes.open(reply_to) as box:
                send = box.send if wire.reads_bundles(fields) else functools.partial(self._reply, reply_to)
                submitted = functools.partial(self._first.release, rid)
                final = await requests.generate(request, send, attempt, seq, submitted)
            if requests.take_orphaned(rid):
                await self._park(message, rid, reply_to)
                return
            m.note_prefill(final)
            parent = tracing.extract(message.headers)
            if self.tracer is not None and parent is not None and final.timings is not None:
                # Under the gateway's request span: one trace across both processes.
                self.tracer.record_engine_phases(parent, final.timings, time.time_ns())
        await message.ack()
        self.completed += 1

    async def _pass_on(self, m: ServedModel, message: AbstractIncomingMessage, body: bytes) -> bool:
        """A request from the resume queue that streamed nothing goes to the shared queue (resume.forward)."""
        return await forward(self._pub.default_exchange, message, body, topology.request_queue(m.name))

    async def _park(self, message: AbstractIncomingMessage, rid: str, reply_to: str) -> None:
        """Hand back a request whose gateway cannot be reached (resume.park), then let it go here."""
        parked = await park(self._pub.default_exchange, message.body, rid, reply_to)
        if parked:
            _log.warning(
                "worker %s: %s handed back to its gateway, which cannot be reached", self.worker_id, rid
            )
        else:
            _log.warning("worker %s: dropping %s: its gateway is gone", self.worker_id, rid)
        await message.ack()

    async def _reply(self, reply_to: str, batch: wire.ReplyBatch) -> None:
        await self._publish_reply(reply_to, wire.encode_batch(batch), batch.request_id)

    async def _publish_reply(self, reply_to: str, body: bytes, correlation: str) -> None:
        message = aio_pika.Message(body, correlation_id=correlation or None)
        await self._pub.default_exchange.publish(message, routing_key=reply_to, mandatory=True, timeout=30)
