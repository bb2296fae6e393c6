"""A broker connection that is rebuilt, not repaired: every (re)connect starts from nothing.

aio-pika's robust connection restores channels, queues and consumers by itself after a broker
restart, and gets them wrong for a worker: it re-consumes with the old channel's consumer tags
("DuplicateConsumerTag"), and restores every slot's consumer while the requests the old channel
delivered still run (a `-np 4` worker held 8). `BrokerSession` keeps a plain connection instead.
When it is lost for any reason (a broker restart, a `kill -9`, a cut link noticed by the AMQP
heartbeat, an error on a channel its owner called essential) it calls `lost()`, so the owner drops
what it built on it (a worker abandons the requests it held: the broker redelivers them and the
gateway's `resume?` answer continues them), connects again, to the next address when it has
several (the nodes of a RabbitMQ cluster), and calls `setup(connection)`: new channels, new
consumer tags, from a known state.

Heartbeat: AMQP_HEARTBEAT_S = 2 s. RabbitMQ closes a connection after two missed heartbeat intervals
(4 s); aiormq gives up on a silent server after (heartbeat + 1) x 3 = 9 s, checked every second:
a cut link (no TCP reset) is noticed within 10 s on both sides. Reconnect attempts back off from
0.2 s to RECONNECT_MAX_S, so a process is back within about a second of its broker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence

from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import AMQPError

from outpost.cluster.broker import connection

_log = logging.getLogger("outpost.cluster")
# aiormq logs every refused connect as an error (once a second through an outage); the session
# says once per outage and address that the broker is not reachable.
logging.getLogger("aiormq.connection").addFilter(
    lambda record: not record.getMessage().startswith("error when creating transport")
)

AMQP_HEARTBEAT_S = 2  # AMQP heartbeat: a cut link is noticed within (2 + 1) x 3 + 1 = 10 s (see above)
RECONNECT_MAX_S = 1.0
CONNECT_TIMEOUT_S = 5.0  # one address's TCP + AMQP handshake (a cut link never answers a SYN)
SETUP_TIMEOUT_S = 30.0  # declares and consumes after connecting (a broker still booting is slow)
# A broker outage up to this long is ridden out: requests in flight resume once it is back. Past
# it, a gateway ends each with an error (its client is told, not left waiting for its timeout).
OUTAGE_BOUND_S = 30.0
# After its own (re)connect, a process takes an unroutable message to a gateway as "that gateway
# is still reconnecting" (it declares its reply queue again after the same outage) for this long,
# and retries; later, an unroutable message means the gateway is gone.
GATEWAY_GRACE_S = 15.0

Setup = Callable[[AbstractConnection], Awaitable[None]]
Lost = Callable[[], Awaitable[None]]


class BrokerSession:
    """One process's connection to the broker (any node of `urls`), rebuilt whenever it is lost."""

    def __init__(self, urls: Sequence[str], name: str, setup: Setup, lost: Lost | None = None) -> None:
        if not urls:
            raise ValueError("no broker address")
        self.urls = list(urls)
        self.name = name
        self._setup = setup
        self._lost = lost
        self.connected = asyncio.Event()
        self.connections = 0  # successful setups; more than 1 means it reconnected
        self.up_since: float | None = None  # time.monotonic() of the last setup done
        self.down_since: float | None = time.monotonic()  # while not connected
        self.url = self.urls[0]  # the address of the current (or last) connection
        self._next = 0
        self._conn: AbstractConnection | None = None
        self._lost_now: asyncio.Future[None] | None = None

    def since_connected(self) -> float:
        """Seconds since the last (re)connect; inf while down."""
        return (
            float("inf")
            if self.up_since is None or not self.connected.is_set()
            else (time.monotonic() - self.up_since)
        )

    def down_for(self) -> float:
        """Seconds the connection has been down; 0 while up."""
        return 0.0 if self.down_since is None else time.monotonic() - self.down_since

    def essential(self, channel: AbstractChannel) -> AbstractChannel:
        """`channel`'s closing (a channel error) ends the connection: everything is rebuilt."""
        channel.close_callbacks.add(self._channel_closed)
        return channel

    def _channel_closed(self, channel: object, exc: BaseException | None = None) -> None:
        if self._lost_now is not None and not self._lost_now.done():
            _log.warning("%s: an essential channel closed (%s); reconnecting", self.name, exc)
            self._lost_now.set_result(None)

    async def run(self) -> None:
        """Connect, set up, and do it again after every loss, until cancelled (or a TLS failure:
        `connection.BrokerTLSError` propagates, as no retry fixes it)."""
        while True:
            conn = await self._connect_any()
            lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._conn, self._lost_now = conn, lost
            conn.close_callbacks.add(functools.partial(_settle, lost))
            try:
                try:
                    await asyncio.wait_for(self._setup(conn), SETUP_TIMEOUT_S)
                except (AMQPError, OSError, RuntimeError, TimeoutError) as exc:
                    _log.warning("%s: setting up on the broker failed (%r); reconnecting", self.name, exc)
                else:
                    self.connections += 1
                    self.up_since, self.down_since = time.monotonic(), None
                    self.connected.set()
                    await lost
                    _log.warning(
                        "%s: lost the broker at %s; reconnecting", self.name, connection.redact(self.url)
                    )
            finally:
                self.connected.clear()
                if self.down_since is None:
                    self.down_since = time.monotonic()
                self._conn = None
                self._next += 1  # the next node first: this one may be the one that went
                await asyncio.shield(_close(conn))
                if self._lost is not None:
                    await self._lost()

    async def _connect_any(self) -> AbstractConnection:
        """The first address that answers, starting after the one last used; backs off between rounds."""
        delay = 0.2
        tried = 0
        while True:
            url = self.urls[self._next % len(self.urls)]
            try:
                conn = await asyncio.wait_for(
                    connection.connect(url, self.name, heartbeat=AMQP_HEARTBEAT_S), CONNECT_TIMEOUT_S
                )
                self.url = url
                return conn
            except (TimeoutError, OSError, AMQPError) as exc:
                if tried < len(self.urls):  # once per address and outage, not per attempt
                    _log.warning(
                        "%s: broker not reachable at %s (%s); retrying",
                        self.name,
                        connection.redact(url),
                        type(exc).__name__,
                    )
                tried += 1
                self._next += 1
                if self._next % len(self.urls) == 0:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RECONNECT_MAX_S)

    async def close(self) -> None:
        """Close the current connection (callers cancel `run` first)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close(conn)


def cancelled_here() -> bool:
    """Whether the running task itself is being cancelled. A `CancelledError` while it is not is the
    connection's: aiormq cancels every call waiting on a connection it finds stuck (a cut link)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


@contextlib.contextmanager
def survive_connection_loss() -> Iterator[None]:
    """For a background loop's broker call: a `CancelledError` that is not this task's own
    cancellation is the connection's (aiormq cancels every call waiting on a connection it finds
    stuck, as after a cut link), and must not end the loop with it (a worker whose heartbeat loop
    ended so was never live again after the link came back)."""
    try:
        yield
    except asyncio.CancelledError:
        if cancelled_here():
            raise


def _settle(future: asyncio.Future[None], *_: object) -> None:
    if not future.done():
        future.set_result(None)


async def _close(conn: AbstractConnection) -> None:
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.close(), 5.0)
