"""What lives on the broker: names, queue arguments and the length-limit policy.

Per model, a durable quorum queue `outpost.req.<model>`: persistent requests, reject-publish on
overflow (the gateway's 429), a small delivery limit (a request that kills workers repeatedly is
poison), dead-lettering (expired or poison) to the fanout `outpost.dlx` -> quorum queue
`outpost.dead`, whose consumers (every gateway) send the request's one final error.

The queue is declared with stable arguments only. Its length limit (`--max-queue`) is applied by
a policy through the management HTTP API: declaring an existing queue with a different
`x-max-length` fails with 406 PRECONDITION_FAILED, while a policy can change with every gateway
start. A broker without the management plugin gets a warning and an unbounded queue.

Per worker, a lane `outpost.lane.<model>.<worker id>`: a quorum queue for requests a gateway routed
to that worker for the prefix its KV holds. A lane message carries a short expiration (the spill
window) and the lane dead-letters (at-least-once) into the model's resume queue, where a worker
sends an expired one on to the request queue, so an affine request the worker cannot take in time
goes to everyone; a delivery limit of 0 sends a request whose worker died there at once. Its
length is bounded (a full lane nacks: the gateway publishes to the shared queue instead) and it is
deleted after a while unused, by which time every message in it has long expired.

Per model, a resume queue `outpost.resume.<model>` (quorum, the request queue's arguments, never a
length limit): requests that may have streamed tokens already, which every worker reads beside its
credits and its engine runs before any request that has not started (worker/intake.py). A lane's
dead (its worker died holding them) arrive there by dead-lettering, and a gateway's resubmission of
a started request is published there. A request that lost its worker in the shared queue stays in
the shared queue: a quorum queue delivers the messages it got back before the others
(tests/integration/test_cluster_requeue_order.py checks it on the broker the project installs).

Fanout exchanges: `outpost.control` (cancels; every worker binds a private queue) and
`outpost.status` (worker heartbeats; every gateway binds a private queue). Each gateway has its
own classic reply queue `outpost.reply.<gateway id>`: not exclusive, so it outlives the gateway's
connection for REPLY_EXPIRY_MS (a cut link: workers keep replying into it and the gateway reads on
when it is back; the cost: a killed gateway's requests run that long before they stop), and transient, so
the nodes left after its node's death let the gateway declare it again (RabbitMQ 4.x lists
transient non-exclusive queues as a deprecated feature, still permitted by default). Beside it a
quorum queue `outpost.parked.<gateway id>`: a request a worker could not reply to (the reply queue
was gone) is handed back there rather than dropped, and the gateway sends it again when it is back.
Per model, a presence quorum queue `outpost.gateways.<model>` that every gateway of the model
consumes and nothing is published to: its consumer count is how many share the queue bound.

Replication: on a RabbitMQ cluster every quorum queue (request queues, lanes, `outpost.dead`) is
declared with `x-quorum-initial-group-size` (`quorum_size`: by default the number of broker
addresses a process is given, at most 3; with one address the argument is left out, as before, so
a single broker's existing queues stay equivalent). The value counts only when a queue is created, and
RabbitMQ refuses to declare an existing queue with another (406 PRECONDITION_FAILED): so the queues
every process declares (the request queues, `outpost.dead`) are declared with their arguments only
when they do not exist yet, and taken as they are (a passive declare) when they do. Processes given
different addresses, or a single broker's queues from before, then work together; the first
process to declare a queue sets its replicas. A lane is declared by its worker alone.

Connecting (URL, password, TLS): connection.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import urllib.parse
from typing import Any

import aio_pika
import httpx
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractQueue,
)
from aiormq.exceptions import AMQPError, ChannelNotFoundEntity

from outpost.cluster.broker.connection import tls_context

_log = logging.getLogger("outpost.cluster")

CONTROL_EXCHANGE = "outpost.control"
STATUS_EXCHANGE = "outpost.status"
DEAD_EXCHANGE = "outpost.dlx"
DEAD_QUEUE = "outpost.dead"
DELIVERY_LIMIT = 2  # deliveries returned unacked (a worker died) before the request is poison
HEARTBEAT_S = 1.0
QUORUM_MAX = 3  # replicas of each quorum queue by default: one node of three may fail
WORKER_TTL_S = 3.5  # a worker silent this long is not live
# URL query parameters that configure TLS (aiormq's names) and the flags that set them.
# RabbitMQ's conventional management ports: https beside amqps, http beside amqp.
MANAGEMENT_PORTS = {"amqps": ("https", 15671), "amqp": ("http", 15672)}


def request_queue(model: str) -> str:
    return f"outpost.req.{model}"


# A lane nobody consumed or declared for 10 minutes goes (a dead worker's). A live worker declares
# its lane again a few times a second (its depth probe), which renews the lease even while every
# credit it has reads the shared queue (RabbitMQ counts consumers, declares and basic.get as use).
LANE_UNUSED_EXPIRY_MS = 600_000


def resume_queue(model: str) -> str:
    return f"outpost.resume.{model}"


def lane_queue(model: str, worker_id: str) -> str:
    return f"outpost.lane.{model}.{worker_id}"


def quorum_size(addresses: int, given: int | None = None) -> int | None:
    """The `x-quorum-initial-group-size` to declare with: `given` (0: leave it out) or, when None,
    the number of broker addresses up to QUORUM_MAX (one address: leave it out)."""
    if given is not None:
        return given or None
    return min(QUORUM_MAX, addresses) if addresses > 1 else None


def quorum_arguments(quorum: int | None = None) -> dict[str, Any]:
    """A quorum queue's type, with its replica count when one is given."""
    return {"x-queue-type": "quorum"} | ({"x-quorum-initial-group-size": quorum} if quorum else {})


def lane_arguments(model: str, length: int, quorum: int | None = None) -> dict[str, Any]:
    """A lane's arguments: quorum, dead-lettered into the model's resume queue."""
    return {
        **quorum_arguments(quorum),
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": resume_queue(model),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",  # at-least-once dead-lettering requires it
        "x-max-length": max(1, length),
        "x-delivery-limit": 0,  # its worker died holding it: to the resume queue at once
        "x-expires": LANE_UNUSED_EXPIRY_MS,
    }


async def declare_lane(
    channel: AbstractChannel, model: str, worker_id: str, length: int, quorum: int | None = None
) -> AbstractQueue:
    return await channel.declare_queue(
        lane_queue(model, worker_id), durable=True, arguments=lane_arguments(model, length, quorum)
    )


async def lane_depth(
    channel: AbstractChannel, model: str, worker_id: str, length: int, quorum: int | None = None
) -> int:
    """Messages ready in a worker's lane, by declaring it again as it was declared: that renews its
    unused-expiry lease and brings it back if it went, where a passive declare of a missing queue
    would be a channel error. `channel` must consume nothing (RabbitMQ 3.10 answers a declare on a
    channel that consumes the queue with 0 ready)."""
    queue = await channel.declare_queue(
        lane_queue(model, worker_id), durable=True, arguments=lane_arguments(model, length, quorum)
    )
    return int(queue.declaration_result.message_count or 0)


async def request_queue_depth(channel: AbstractChannel, model: str) -> int:
    """Messages ready in a model's request queue (a passive declare: the process declared it at
    setup, and another process may have created it with another replica count)."""
    queue = await channel.declare_queue(request_queue(model), passive=True)
    return int(queue.declaration_result.message_count or 0)


GATEWAYS_EXPIRY_MS = 3_600_000  # a model no gateway has served for an hour: its presence queue goes


def gateways_queue(model: str) -> str:
    return f"outpost.gateways.{model}"


async def declare_gateways_queue(
    conn: AbstractConnection, channel: AbstractChannel, model: str, quorum: int | None = None
) -> AbstractQueue:
    """A model's presence queue: every gateway of the model consumes it (nothing is ever published
    to it), so its consumer count is the number of gateways serving the model (a quorum queue:
    the count survives a node's death)."""
    arguments = {**quorum_arguments(quorum), "x-expires": GATEWAYS_EXPIRY_MS}
    return await declare_shared(conn, channel, gateways_queue(model), arguments)


async def gateways_connected(channel: AbstractChannel, model: str) -> int:
    """Gateways serving `model` now (its presence queue's consumers)."""
    queue = await channel.declare_queue(gateways_queue(model), passive=True)
    return int(queue.declaration_result.consumer_count or 0)


def reply_queue(gateway_id: str) -> str:
    return f"outpost.reply.{gateway_id}"


# A gateway's reply queue outlives its connection this long: a cut link up to about this long
# (counted from when the broker drops the silent connection, 4 s in) loses no reply and hands
# nothing over; longer, the broker lost what was in it and the gateway resends (gateway/inflight.py). A
# killed gateway's requests run on the workers this long before their replies become unroutable.
REPLY_EXPIRY_MS = 20_000
PARKED_EXPIRY_MS = 120_000  # a parked request waits this long for its gateway to come back


def reply_arguments() -> dict[str, Any]:
    return {"x-expires": REPLY_EXPIRY_MS}


def parked_queue(reply_to: str) -> str:
    """The parked queue beside the reply queue `reply_to` (outpost.reply.X -> outpost.parked.X)."""
    return "outpost.parked." + reply_to.removeprefix("outpost.reply.")


async def declare_parked(channel: AbstractChannel, reply_to: str, quorum: int | None = None) -> AbstractQueue:
    """The parked queue beside `reply_to` (declared by its gateway alone: its arguments never vary)."""
    arguments = {**quorum_arguments(quorum), "x-expires": PARKED_EXPIRY_MS}
    return await channel.declare_queue(parked_queue(reply_to), durable=True, arguments=arguments)


def request_queue_arguments(quorum: int | None = None) -> dict[str, Any]:
    """The arguments every process declares the request queue with (never the length limit)."""
    return {
        **quorum_arguments(quorum),
        "x-delivery-limit": DELIVERY_LIMIT,
        "x-dead-letter-exchange": DEAD_EXCHANGE,
        "x-overflow": "reject-publish",
    }


async def declare_shared(
    conn: AbstractConnection, channel: AbstractChannel, name: str, arguments: dict[str, Any]
) -> AbstractQueue:
    """Declare a queue every process declares: with `arguments` if it does not exist yet, else as
    it is (see the module docstring: its replica count was fixed when it was created). Two processes
    creating it at once with different arguments: the loser's channel fails, and its reconnect finds
    the queue."""
    if await queue_exists(conn, name):
        return await channel.declare_queue(name, passive=True)
    return await channel.declare_queue(name, durable=True, arguments=arguments)


async def queue_exists(conn: AbstractConnection, name: str) -> bool:
    """Whether the broker has queue `name` now (a passive declare on a channel of its own: a
    missing queue closes the channel it was asked on)."""
    scratch = await conn.channel()
    try:
        await scratch.declare_queue(name, passive=True)
        return True
    except ChannelNotFoundEntity:
        return False
    finally:
        await asyncio.shield(_close_quietly(scratch))


async def _close_quietly(channel: AbstractChannel) -> None:
    # The connection may have gone meanwhile: the setup then fails on its own channels.
    with contextlib.suppress(AMQPError, OSError, RuntimeError):
        if not channel.is_closed:
            await channel.close()


async def declare_common(
    conn: AbstractConnection, channel: AbstractChannel, quorum: int | None = None
) -> tuple[AbstractExchange, AbstractExchange]:
    """The dead-letter path and the control/status exchanges; returns (control, status)."""
    dlx = await channel.declare_exchange(DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    dead = await declare_shared(conn, channel, DEAD_QUEUE, quorum_arguments(quorum))
    await dead.bind(dlx)
    control = await channel.declare_exchange(CONTROL_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    status = await channel.declare_exchange(STATUS_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    return control, status


async def declare_request_queue(
    conn: AbstractConnection, channel: AbstractChannel, model: str, quorum: int | None = None
) -> AbstractQueue:
    return await declare_shared(conn, channel, request_queue(model), request_queue_arguments(quorum))


async def declare_resume_queue(
    conn: AbstractConnection, channel: AbstractChannel, model: str, quorum: int | None = None
) -> AbstractQueue:
    """The model's resume queue: the request queue's arguments (poison and expiry alike), unbounded."""
    return await declare_shared(conn, channel, resume_queue(model), request_queue_arguments(quorum))


async def apply_length_policy(
    amqp_url: str, management_url: str | None, models: list[str], max_queue: int
) -> bool:
    """Set `max-length` on the models' request queues by a policy; False (and a warning) if impossible."""
    parts = urllib.parse.urlsplit(amqp_url)
    # amqps: https by default, so the password sent to the API is no less protected than on AMQP.
    scheme, port = MANAGEMENT_PORTS[parts.scheme]
    base = management_url or f"{scheme}://{parts.hostname or '127.0.0.1'}:{port}/"
    vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    auth = (urllib.parse.unquote(parts.username or "guest"), urllib.parse.unquote(parts.password or "guest"))
    try:
        # An https API is verified against the broker's CA (and given the client certificate).
        async with httpx.AsyncClient(timeout=5.0, verify=tls_context(amqp_url) or True) as client:
            for model in models:  # one policy per model: gateways serving other sets never overlap
                body = {
                    "pattern": "^" + re.escape(request_queue(model)) + "$",
                    "definition": {"max-length": max_queue, "overflow": "reject-publish"},
                    "apply-to": "queues",
                    "priority": 10,
                }
                name = urllib.parse.quote(f"outpost-req-{model}", safe="")
                url = f"{base.rstrip('/')}/api/policies/{urllib.parse.quote(vhost, safe='')}/{name}"
                reply = await client.put(url, json=body, auth=auth)
                reply.raise_for_status()
        return True
    except httpx.HTTPError as exc:
        _log.warning(
            "could not set the queue length policy through the management API at %s (%s: %s): "
            "the request queues are unbounded; enable rabbitmq_management or set the policy yourself "
            "(rabbitmqctl set_policy ... '{\"max-length\": %d}')",
            base,
            type(exc).__name__,
            " ".join(str(exc).split()),
            max_queue,
        )
        return False
