"""What a gateway reads of its request queues: their depths and how many gateways share each model.

Read on a probe channel of its own (a passive declare of a missing queue closes its channel; it is
reopened on the same connection): polled twice a second for /metrics, /health and the share of
`--max-queue` each gateway admits (admission.py), and read afresh when a publish is nacked, to tell a
full queue (429) from one that cannot take a message now (503; inflight.nack_is_full).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from aio_pika.abc import AbstractChannel, AbstractConnection
from aiormq.exceptions import AMQPError

from outpost.cluster.broker import topology
from outpost.cluster.broker.session import survive_connection_loss

POLL_S = 0.5


class QueueDepths:
    """The models' request-queue depths (`depths`) and gateway counts (`gateways`, at least 1)."""

    def __init__(self, models: list[str]) -> None:
        self.models = models
        self.depths: dict[str, int] = {}
        self.gateways = {m: 1 for m in models}  # gateways serving each model: the bound's share
        self.rounds = 0  # completed polls of every model: what a reader waits on for a fresh count
        self._conn: AbstractConnection | None = None
        self._probe: AbstractChannel | None = None

    async def attach(self, conn: AbstractConnection) -> None:
        """Read on `conn` from now on (a new connection after a loss)."""
        self._conn, self._probe = conn, await conn.channel()

    def detach(self) -> None:
        """The connection is lost: nothing to read until the next `attach`."""
        self._conn = None

    async def _channel(self) -> AbstractChannel:
        if self._conn is None or self._probe is None:
            raise RuntimeError("no broker connection")
        if self._probe.is_closed:  # a failed declare closed it; the connection is fine
            self._probe = await self._conn.channel()
        return self._probe

    async def fresh(self, model: str) -> int | None:
        """The request queue's depth now; None when it cannot be read (no leader, no connection)."""
        try:
            return await asyncio.wait_for(topology.request_queue_depth(await self._channel(), model), 2.0)
        except (TimeoutError, AMQPError, OSError, RuntimeError):
            return None

    async def poll(self, connected: Callable[[], bool]) -> None:
        """Forever: every POLL_S, while `connected()`, each model's depth and gateway count."""
        while True:
            with (
                survive_connection_loss(),
                contextlib.suppress(AMQPError, OSError, RuntimeError, asyncio.TimeoutError),
            ):
                if connected():
                    probe = await self._channel()
                    for model in self.models:
                        self.depths[model] = await topology.request_queue_depth(probe, model)
                        self.gateways[model] = max(1, await topology.gateways_connected(probe, model))
                    self.rounds += 1
            await asyncio.sleep(POLL_S)
