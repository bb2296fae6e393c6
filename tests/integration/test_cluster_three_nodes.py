"""A three-node RabbitMQ cluster on loopback (`scripts/broker.sh start --nodes 3`): gateway and
workers given every node's address lose nothing when one node is killed under load.

The engines hold every stream at a fixed position (FakeBackend's gate) until the node has been
killed and booted again, so the streams are in flight across the failure whatever the machine's
speed. Token i of a request is its position: a repeated or skipped token shows. Bounded waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_cluster_broker import collect, request, until
from test_cluster_broker_faults import LIMIT_S, PROMPT, _model, assert_complete, held_engine

from benchmarks.harness.broker import Broker
from outpost.cluster.broker import topology
from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.worker.service import Worker

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker(tmp_path_factory.mktemp("rabbitmq-3"), nodes=3).booted() as own:
        yield own


def test_one_node_of_three_killed_under_load_loses_nothing(cluster3: Broker) -> None:
    broker = cluster3
    engines = [held_engine(slots=2), held_engine(slots=2)]
    model = _model()

    async def main() -> None:
        link = GatewayLink(broker.urls, [model])
        link.outage_bound_s = LIMIT_S  # a reconnect is seconds; never the bound's doing here
        await link.start(120)
        stops = [asyncio.Event() for _ in engines]
        workers = [Worker(broker.urls, model, e) for e in engines]
        tasks = [asyncio.ensure_future(w.run(s)) for w, s in zip(workers, stops, strict=True)]
        try:
            backend = RemoteBackend(link, model, None)  # type: ignore[arg-type]
            await until(lambda: len(link.live_workers(model)) == 2, "two workers live", 60)
            members = await _members(broker, topology.request_queue(model))
            assert len(members) == 3, members  # the request queue is replicated on every node
            streams = [await backend.submit(request(PROMPT, 30, deadline_s=None)) for _ in range(6)]
            pending = [asyncio.ensure_future(collect(s)) for s in streams]
            await until(lambda: sum(len(e.holding) for e in engines) == 4, "four streams held mid-way", 60)
            await asyncio.to_thread(broker.kill9, 1)  # the node everyone connected to first
            await until(
                lambda: link.connected and link._session.connections >= 2, "gateway on another node", 60
            )  # type: ignore[union-attr]
            for engine in engines:
                engine.gate.set()
            results = await asyncio.wait_for(asyncio.gather(*pending), 180)
            for events in results:
                assert_complete(events, 30)
            assert all(w.max_held <= 2 for w in workers)
            await asyncio.to_thread(broker.start)  # the killed node boots and rejoins
        finally:
            for stop in stops:
                stop.set()
            await asyncio.wait(set(tasks), timeout=30)
            await link.close()

    asyncio.run(asyncio.wait_for(main(), LIMIT_S))


async def _members(broker: Broker, queue: str) -> list[str]:
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.get(f"{broker.mgmt_url}/api/queues/%2F/{queue}", auth=broker.mgmt_auth)
        r.raise_for_status()
        return list(r.json().get("members") or [])


def test_request_queues_are_declared_with_three_replicas(cluster3: Broker) -> None:
    """Given the three nodes' addresses, gateway and worker declare every quorum queue with
    `x-quorum-initial-group-size` 3 (each has three members); `--broker-quorum-size 2` gives two,
    so the members come from the argument, not from RabbitMQ's own default (every node)."""
    broker = cluster3
    engine = held_engine(slots=1)
    model, narrow = _model(), _model()

    async def main() -> None:
        link = GatewayLink(broker.urls, [model])
        await link.start(120)
        stop = asyncio.Event()
        worker = Worker(broker.urls, model, engine)
        task = asyncio.ensure_future(worker.run(stop))
        other = GatewayLink(broker.urls, [narrow], quorum_size=2)
        await other.start(120)
        try:
            await until(lambda: len(link.live_workers(model)) == 1, "the worker live", 60)
            for queue in (topology.request_queue(model), topology.lane_queue(model, worker.worker_id)):
                info = await _queue(broker, queue)
                assert info["arguments"]["x-quorum-initial-group-size"] == 3, info["arguments"]
                assert len(info["members"]) == 3, info["members"]
            narrow_info = await _queue(broker, topology.request_queue(narrow))
            assert narrow_info["arguments"]["x-quorum-initial-group-size"] == 2
            assert len(narrow_info["members"]) == 2, narrow_info["members"]
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=30)
            await other.close()
            await link.close()

    asyncio.run(asyncio.wait_for(main(), LIMIT_S))


async def _queue(broker: Broker, queue: str) -> dict[str, Any]:
    """The management API's view of a queue (members appear once its replicas have started)."""
    async with httpx.AsyncClient(timeout=30) as client:
        for _ in range(120):  # bounded: 60 s
            r = await client.get(f"{broker.mgmt_url}/api/queues/%2F/{queue}", auth=broker.mgmt_auth)
            r.raise_for_status()
            info: dict[str, Any] = r.json()
            if info.get("members"):
                return info
            await asyncio.sleep(0.5)
    raise AssertionError(f"{queue} has no members listed")
