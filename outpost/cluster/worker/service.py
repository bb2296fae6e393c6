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

Decoding runs on the backend's engine thread; this event loop only moves messages (AMQP heartbeats keep
flowing during long prefills).
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
from typing import TYPE_CHECKING

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractIncomingMessage
from aiormq.exceptions import AMQPError, ChannelInvalidStateError, PublishError

from outpost import tracing
from outpost.backend import InferenceBackend
from outpost.cluster import embed, wire
from outpost.cluster.broker import topology
from outpost.cluster.broker.session import BrokerSession, survive_connection_loss
from outpost.cluster.heartbeat import Heartbeat, encode_heartbeat, template_hash
from outpost.cluster.prefix import BLOCK, PrefixIndex
from outpost.cluster.worker.cancels import CancelMemory
from outpost.cluster.worker.intake import LANE, SHARED, Intake
from outpost.cluster.worker.outbox import Outboxes
from outpost.cluster.worker.requests import BackendRequests, final_without_running
from outpost.cluster.worker.resume import ResumeUnanswered, ask_resume, continued, may_have_started, park
from outpost.messages import TokenEvent

if TYPE_CHECKING:
    from outpost.tracing import Tracer

_log = logging.getLogger("outpost.cluster.worker")

LOST_DRAIN_S = 30.0  # the requests of a lost connection end within an engine step of their abort


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    """One process's consumer of `outpost.req.<model>` on top of an InferenceBackend."""

    def __init__(
        self,
        url: str | Sequence[str],
        model: str,
        backend: InferenceBackend,
        worker_id: str | None = None,
        tracer: Tracer | None = None,
        quorum_size: int | None = None,
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)  # a cluster's nodes: any will do
        self.quorum = topology.quorum_size(len(self.urls), quorum_size)  # replicas of its queues
        self.tracer = tracer
        self.model = model
        self.backend = backend
        self.slots = backend.stats().slots_total  # fixed for the engine's life: the intake's credit
        self._template = template_hash(backend.codec.chat_template_source)
        self.worker_id = worker_id or default_worker_id()
        self._cancels = CancelMemory()
        self._resumes: dict[str, asyncio.Future[wire.ResumeState]] = {}
        self._draining = False
        self._prefixes = PrefixIndex()
        self.prefill_tps = 0.0  # recent prompt tokens per second (an average of finished requests)
        self.completed = 0
        self.lane = topology.lane_queue(model, self.worker_id)
        self._intake: Intake | None = None
        self._watch: asyncio.Future[None] | None = None
        self._held = 0
        self.max_held = 0  # the most requests it ever held at once (never more than its slots)
        self._conn: AbstractConnection | None = None
        self._session = BrokerSession(self.urls, "", self._setup)  # replaced by run()'s
        self._outboxes = Outboxes(self._publish_reply)
        self._requests = BackendRequests(
            backend, self.worker_id, self._cancels, lambda: self._session.since_connected()
        )

    @property
    def in_flight(self) -> int:
        """Requests this worker holds (delivered, not yet acked)."""
        return len(self._intake.tasks) if self._intake is not None else 0

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
            if self._intake is not None:
                await self._intake.stop()
            while self._intake is not None and self._intake.tasks:  # in flight: finish them, ack them
                await asyncio.wait(set(self._intake.tasks))
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
            if self._intake is not None:
                self._intake.abandon()
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
        shared = await topology.declare_request_queue(conn, consume_ch, self.model, self.quorum)
        self._shared_name = shared.name
        lane = await topology.declare_lane(consume_ch, self.model, self.worker_id, self.slots, self.quorum)
        side = session.essential(await conn.channel())
        control_q = await side.declare_queue(
            f"outpost.control.{self.worker_id}", exclusive=True, auto_delete=True
        )
        await control_q.bind(control)
        await control_q.consume(self._on_control, no_ack=True)
        self._private = topology.reply_queue(f"worker.{self.worker_id}")
        private_q = await side.declare_queue(self._private, exclusive=True, auto_delete=True)
        await private_q.consume(self._on_private, no_ack=True)
        self._conn, self._pub = conn, pub
        self._probe = await conn.channel()  # depths only: a failed declare must not close pub or consume_ch
        intake = Intake(consume_ch, {LANE: lane, SHARED: shared}, self.slots, self._handle, self._depth)
        self._intake = intake
        await intake.start()
        self._watch = asyncio.ensure_future(intake.watch())
        if session.connections:
            _log.warning("worker %s: consuming %s and %s again", self.worker_id, self._shared_name, self.lane)
        else:
            _log.warning("worker %s: consuming %s and %s", self.worker_id, self._shared_name, self.lane)

    async def _on_lost(self) -> None:
        """The connection went: what it delivered can no longer be acked, and the broker gives it
        again (here or to another worker, whose `resume?` continues it). End it all before the next
        setup consumes, so this worker never holds more requests than it has slots."""
        intake, self._intake = self._intake, None
        if self._watch is not None:
            self._watch.cancel()
        if intake is None:
            return
        intake.abandon()
        if intake.tasks:
            _, left = await asyncio.wait(set(intake.tasks), timeout=LOST_DRAIN_S)
            if left:
                _log.error(
                    "worker %s: %d requests did not end after the connection went", self.worker_id, len(left)
                )

    async def _depth(self, source: str) -> int:
        """Ready messages in the lane or the shared queue. Declaring the lane again renews its
        unused-expiry lease while no credit consumes it (all on the shared queue, or one slot)."""
        if self._probe.is_closed and self._conn is not None:  # a failed declare closed it
            self._probe = await self._conn.channel()
        if source == LANE:
            return await topology.lane_depth(self._probe, self.model, self.worker_id, self.slots, self.quorum)
        return await topology.request_queue_depth(self._probe, self.model)

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
        kv_cells = self.backend.stats().kv_cells_total
        hb = Heartbeat(
            self.worker_id,
            self.model,
            self.slots,
            self.in_flight,
            self._draining,
            self.completed,
            self.lane,
            tuple(self._prefixes.hashes(self.backend.cached_sequences())),
            self.prefill_tps,
            kv_cells // BLOCK,
            self.backend.n_ctx_seq,
            kv_cells,
            self._template,
        )
        message = aio_pika.Message(encode_heartbeat(hb), expiration=topology.WORKER_TTL_S)
        await self._status.publish(message, routing_key="", mandatory=False, timeout=5)

    # -- control --------------------------------------------------------------------------------

    async def _on_control(self, message: AbstractIncomingMessage) -> None:
        try:
            cancel = wire.decode_cancel(message.body)
        except wire.WireError as exc:
            _log.warning("ignoring a control message: %s", exc)
            return
        if self._cancels.should_stop(cancel.request_id, cancel.before_attempt):
            if cancel.before_attempt is not None:
                rid = cancel.request_id
                _log.warning("worker %s: %s was resumed elsewhere; ending this copy", self.worker_id, rid)
            await self.backend.abort(cancel.request_id)

    async def _on_private(self, message: AbstractIncomingMessage) -> None:
        try:
            state = wire.decode_resume(message.body)
        except wire.WireError as exc:
            _log.warning("ignoring a message on the private queue: %s", exc)
            return
        future = self._resumes.get(state.request_id)
        if future is not None and not future.done():
            future.set_result(state)

    # -- requests -------------------------------------------------------------------------------

    async def _handle(self, message: AbstractIncomingMessage) -> None:
        self._held += 1  # across connections: a lost one's requests count until they have ended
        self.max_held = max(self.max_held, self._held)
        try:
            await self._serve(message)
        except (AMQPError, ConnectionError, ChannelInvalidStateError, asyncio.CancelledError) as exc:
            if isinstance(exc, asyncio.CancelledError) and _cancelling():
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
            self._held -= 1

    async def _serve(self, message: AbstractIncomingMessage) -> None:
        try:
            fields = wire.loads(message.body, ("request", "embed"))  # parsed once: kind, request, flags
            request = None if fields["kind"] == "embed" else wire.decode_request(fields)
        except wire.WireError as exc:
            _log.error("worker %s: dropping an unreadable request: %s", self.worker_id, exc)
            await message.reject(requeue=False)  # dead-lettered: the gateway answers it
            return
        if request is None:  # an embedding job, idempotent: a redelivered one is computed again
            await embed.answer(message, self.backend.embed, self._pub.default_exchange)
            self.completed += 1
            return
        reply_to = message.reply_to
        rid = request.request_id
        if reply_to is None or self._cancels.take_cancelled(rid):
            await message.ack()
            return
        attempt, seq = 0, 0
        resumes = may_have_started(message) or wire.was_resubmitted(fields)
        if not resumes and self._cancels.superseded(rid):
            await message.ack()  # a first copy whose request was resumed elsewhere meanwhile
            return
        if resumes:
            state = await self._ask_resume(rid, reply_to)
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
            attempt, seq = state.attempt, state.seq
            request = continued(request, state.token_ids)
            _log.warning("worker %s: resuming %s after %d tokens", self.worker_id, rid, len(state.token_ids))
        await self._requests.end_stale_copy(rid)
        final = final_without_running(request)
        if final is not None:
            await self._reply(reply_to, wire.ReplyBatch(rid, attempt, seq, [final]))
        else:
            with self._outboxes.open(reply_to) as box:
                send = box.send if wire.reads_bundles(fields) else functools.partial(self._reply, reply_to)
                final = await self._requests.generate(request, send, attempt, seq)
            if self._requests.take_orphaned(rid):
                await self._park(message, rid, reply_to)
                return
            self._note_prefill(final)
            parent = tracing.extract(message.headers)
            if self.tracer is not None and parent is not None and final.timings is not None:
                # Under the gateway's request span: one trace across both processes.
                self.tracer.record_engine_phases(parent, final.timings, time.time_ns())
        await message.ack()
        self.completed += 1

    def _note_prefill(self, final: TokenEvent) -> None:
        """Keeps a running average of prompt tokens/s: gateways size their spill windows with it."""
        t = final.timings
        if t is None or t.prompt_n < 16 or t.prompt_ms <= 0:
            return
        tps = t.prompt_n / t.prompt_ms * 1000.0
        self.prefill_tps = tps if self.prefill_tps == 0 else 0.8 * self.prefill_tps + 0.2 * tps

    async def _ask_resume(self, rid: str, reply_to: str) -> wire.ResumeState | None:
        """What the client already has (resume.ask_resume); None when its gateway is gone."""
        future: asyncio.Future[wire.ResumeState] = asyncio.get_running_loop().create_future()
        self._resumes[rid] = future
        try:
            exchange = self._pub.default_exchange
            return await ask_resume(
                exchange, self._private, rid, reply_to, future, self._session.since_connected
            )
        finally:
            self._resumes.pop(rid, None)

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
