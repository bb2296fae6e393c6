"""What lives on the broker: names, queue arguments, the length-limit policy, and how to connect.

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
window) and the lane dead-letters into the model's request queue (at-least-once), so an affine
request the worker cannot take in time goes to everyone; a delivery limit of 0 sends a request
whose worker died straight there too. Its length is bounded (a full lane nacks: the gateway
publishes to the shared queue instead) and it is deleted after a while unused, by which time
every message in it has long expired into the shared queue.

Fanout exchanges: `outpost.control` (cancels; every worker binds a private queue) and
`outpost.status` (worker heartbeats; every gateway binds a private queue). Each gateway has its
own classic exclusive auto-delete reply queue `outpost.reply.<gateway id>`.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from pathlib import Path
from typing import Any

import aio_pika
import httpx
from aio_pika.abc import AbstractChannel, AbstractExchange, AbstractQueue, AbstractRobustConnection

_log = logging.getLogger("outpost.cluster")

CONTROL_EXCHANGE = "outpost.control"
STATUS_EXCHANGE = "outpost.status"
DEAD_EXCHANGE = "outpost.dlx"
DEAD_QUEUE = "outpost.dead"
DELIVERY_LIMIT = 2  # deliveries returned unacked (a worker died) before the request is poison
HEARTBEAT_S = 1.0
WORKER_TTL_S = 3.5  # a worker silent this long is not live


def request_queue(model: str) -> str:
    return f"outpost.req.{model}"


LANE_UNUSED_EXPIRY_MS = 600_000  # a lane nobody consumed for 10 minutes goes


def lane_queue(model: str, worker_id: str) -> str:
    return f"outpost.lane.{model}.{worker_id}"


def lane_arguments(model: str, length: int) -> dict[str, Any]:
    """A lane's arguments: quorum, dead-lettered into the model's request queue."""
    return {
        "x-queue-type": "quorum",
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": request_queue(model),
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",  # at-least-once dead-lettering requires it
        "x-max-length": max(1, length),
        "x-delivery-limit": 0,  # its worker died holding it: to the shared queue at once
        "x-expires": LANE_UNUSED_EXPIRY_MS,
    }


async def declare_lane(channel: AbstractChannel, model: str, worker_id: str, length: int) -> AbstractQueue:
    return await channel.declare_queue(
        lane_queue(model, worker_id), durable=True, arguments=lane_arguments(model, length)
    )


def reply_queue(gateway_id: str) -> str:
    return f"outpost.reply.{gateway_id}"


def request_queue_arguments() -> dict[str, Any]:
    """The arguments every process declares the request queue with (never the length limit)."""
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": DELIVERY_LIMIT,
        "x-dead-letter-exchange": DEAD_EXCHANGE,
        "x-overflow": "reject-publish",
    }


def broker_url(url: str, password_file: str | None = None, env_var: str = "OUTPOST_BROKER_PASSWORD") -> str:
    """The AMQP URL with the password from a file or the environment (never from argv)."""
    import os

    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"--broker must be an amqp:// or amqps:// URL, not {url!r}")
    if parts.password:
        raise ValueError("put the broker password in --broker-password-file or $" + env_var + ", not the URL")
    password = None
    if password_file:
        password = Path(password_file).read_text().strip()
    elif os.environ.get(env_var):
        password = os.environ[env_var]
    if password is None:
        return url
    user = urllib.parse.quote(parts.username or "guest", safe="")
    host = parts.hostname or "127.0.0.1"
    netloc = f"{user}:{urllib.parse.quote(password, safe='')}@{host}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact(url: str) -> str:
    """The URL as logs may show it."""
    parts = urllib.parse.urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}{parts.path}"


async def connect(url: str, name: str) -> AbstractRobustConnection:
    """A connection that reconnects by itself; heartbeats every 5 s (the I/O is never blocked)."""
    return await aio_pika.connect_robust(_named(url, name), heartbeat=5, reconnect_interval=0.5)


def _named(url: str, name: str) -> str:
    """`url` with the connection name the broker lists (aio-pika drops client_properties given a URL)."""
    parts = urllib.parse.urlsplit(url)
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k != "name"]
    query = urllib.parse.urlencode([*pairs, ("name", name)], safe="/", quote_via=urllib.parse.quote)
    return urllib.parse.urlunsplit(parts._replace(query=query))


async def declare_common(channel: AbstractChannel) -> tuple[AbstractExchange, AbstractExchange]:
    """The dead-letter path and the control/status exchanges; returns (control, status)."""
    dlx = await channel.declare_exchange(DEAD_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    dead = await channel.declare_queue(DEAD_QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    await dead.bind(dlx)
    control = await channel.declare_exchange(CONTROL_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    status = await channel.declare_exchange(STATUS_EXCHANGE, aio_pika.ExchangeType.FANOUT, durable=True)
    return control, status


async def declare_request_queue(channel: AbstractChannel, model: str) -> AbstractQueue:
    return await channel.declare_queue(
        request_queue(model), durable=True, arguments=request_queue_arguments()
    )


async def apply_length_policy(
    amqp_url: str, management_url: str | None, models: list[str], max_queue: int
) -> bool:
    """Set `max-length` on the models' request queues by a policy; False (and a warning) if impossible."""
    parts = urllib.parse.urlsplit(amqp_url)
    base = management_url or f"http://{parts.hostname or '127.0.0.1'}:15672/"
    vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    auth = (urllib.parse.unquote(parts.username or "guest"), urllib.parse.unquote(parts.password or "guest"))
    try:
        async with httpx.AsyncClient(timeout=5.0) as client:
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
            "could not set the queue length policy through the management API at %s (%s): "
            "the request queues are unbounded; enable rabbitmq_management or set the policy yourself "
            "(rabbitmqctl set_policy ... '{\"max-length\": %d}')",
            base,
            type(exc).__name__,
            max_queue,
        )
        return False
