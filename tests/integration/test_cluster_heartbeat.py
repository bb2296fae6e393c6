"""The AMQP heartbeat gateway and worker connect with is the one docs/cluster.md states (2 s), as the
broker itself sees it: a cut link is noticed within 10 s only if it is really negotiated (aio-pika
drops a `heartbeat=` keyword: aiormq reads it from the URL alone, else 60 s)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from benchmarks.harness.broker import Broker
from outpost.cluster.broker import connection
from outpost.cluster.broker.session import AMQP_HEARTBEAT_S

pytestmark = pytest.mark.cluster


def test_connections_negotiate_the_documented_heartbeat(rabbitmq: Broker) -> None:
    name = "outpost-test heartbeat"

    async def main() -> list[int]:
        conn = await connection.connect(rabbitmq.url, name, heartbeat=AMQP_HEARTBEAT_S)
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for _ in range(120):  # bounded: the management API lists a connection within seconds
                    r = await client.get(f"{rabbitmq.mgmt_url}/api/connections", auth=rabbitmq.mgmt_auth)
                    found = [
                        int(c["timeout"])
                        for c in r.json()
                        if c.get("client_properties", {}).get("connection_name") == name
                    ]
                    if found:
                        return found
                    await asyncio.sleep(0.5)
            return []
        finally:
            await conn.close()

    assert AMQP_HEARTBEAT_S == 2
    assert asyncio.run(main()) == [2]
