"""The gateway link and a worker ride out their broker's faults (a broker of this module's own).

The engine holds every stream at a fixed position (FakeBackend's gate) until the test has broken
and restored the broker, so the streams are certainly in flight across the outage whatever the
machine's speed. Token i of a request is its position: a resumed stream that repeats or skips a
token shows. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import aio_pika
import pytest
from fake_backend import FakeBackend
from test_cluster_broker import cluster, collect, request, tokens, until

from benchmarks.harness.broker import Broker
from benchmarks.harness.ports import free_ports
from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.worker.service import Worker
from outpost.messages import BackendUnavailable, FinishReason, TokenEvent

pytestmark = pytest.mark.cluster
LIMIT_S = 400.0  # a broker restart is two boots' worth of a loaded machine, at most
PROMPT = 3
HOLD_AFTER = 5  # output tokens each stream sends before the engine holds it


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker this module stops, restarts and kills (the session's stays up for the others)."""
    with Broker(tmp_path_factory.mktemp("rabbitmq-faults")).booted() as own:
        yield own


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, LIMIT_S))


def held_engine(slots: int) -> FakeBackend:
    engine = FakeBackend.counting(slots=slots, step_s=0.005)
    engine.hold_at = PROMPT + HOLD_AFTER
    return engine


def _model() -> str:
    return "faults-" + uuid.uuid4().hex[:8]


def assert_complete(events: list[TokenEvent], max_tokens: int) -> None:
    assert tokens(events) == list(range(PROMPT, PROMPT + max_tokens)), events[-1]  # none repeated/missing
    assert events[-1].finish_reason is FinishReason.LENGTH, events[-1]
    assert sum(e.finished for e in events) == 1


def test_broker_restart_with_streams_in_flight_and_queued_loses_nothing(broker: Broker) -> None:
    """2 streams mid-way on a 2-slot worker and 2 requests queued behind them; the broker stops and
    starts: all 4 complete, the resumed ones exact at the seam, and the worker never holds more
    than its 2 slots (it re-consumes only once what the lost connection held has ended)."""
    engine = held_engine(slots=2)

    async def main() -> None:
        async with cluster(broker, _model(), [engine]) as (backend, workers):
            worker, link = workers[0][0], backend.link
            link.outage_bound_s = LIMIT_S  # a restart here may outlast the 30 s bound (a slow boot)
            streams = [await backend.submit(request(PROMPT, 40, deadline_s=None)) for _ in range(4)]
            tasks = [asyncio.ensure_future(collect(s)) for s in streams]
            await until(lambda: len(engine.holding) == 2, "two streams held mid-way")
            await asyncio.to_thread(broker.stop)
            await until(lambda: not link.connected, "the gateway sees the broker gone")
            with pytest.raises(BackendUnavailable):
                await backend.submit(request(PROMPT, 4))  # not accepted: 503, at once
            await asyncio.to_thread(broker.start)
            engine.gate.set()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            for events in results:
                assert_complete(events, 40)
            assert link.counters["resumes"] >= 2
            assert worker._session.connections >= 2 and link._session is not None
            assert link._session.connections >= 2
            assert worker.max_held <= 2

    run(main())


def test_broker_kill9_every_request_ends(broker: Broker) -> None:
    """The broker's VM SIGKILLed under 2 held streams and 2 queued requests, then booted again:
    every request ends with one final event, and any that completes is exact."""
    engine = held_engine(slots=2)

    async def main() -> None:
        async with cluster(broker, _model(), [engine]) as (backend, workers):
            backend.link.outage_bound_s = LIMIT_S  # a boot here may outlast the 30 s bound
            streams = [await backend.submit(request(PROMPT, 30, deadline_s=None)) for _ in range(4)]
            tasks = [asyncio.ensure_future(collect(s)) for s in streams]
            await until(lambda: len(engine.holding) == 2, "two streams held mid-way")
            await asyncio.to_thread(broker.kill9)
            await asyncio.to_thread(broker.start)
            engine.gate.set()
            results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            for events in results:
                assert sum(e.finished for e in events) == 1
                if events[-1].finish_reason is FinishReason.LENGTH:
                    assert_complete(events, 30)
                else:
                    assert events[-1].error, events[-1]
            assert workers[0][0].max_held <= 2

    run(main())


def test_an_outage_past_the_bound_ends_streams_with_an_error(broker: Broker) -> None:
    """Past the outage bound (shortened here) every request in flight ends with a clear error;
    once the broker is back, the worker drops their redeliveries (their client is gone) and
    serves new requests."""
    engine = held_engine(slots=2)

    async def main() -> None:
        async with cluster(broker, _model(), [engine]) as (backend, workers):
            worker, link = workers[0][0], backend.link
            link.outage_bound_s = 2.0
            streams = [await backend.submit(request(PROMPT, 30, deadline_s=None)) for _ in range(3)]
            tasks = [asyncio.ensure_future(collect(s)) for s in streams]
            await until(lambda: len(engine.holding) == 2, "two streams held mid-way")
            await asyncio.to_thread(broker.stop)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            for events in results:
                assert [e.finish_reason for e in events if e.finished] == [FinishReason.ERROR]
                assert "unreachable" in (events[-1].error or "")
            engine.gate.set()
            await asyncio.to_thread(broker.start)
            await until(lambda: worker._session.connections >= 2 and link.connected, "reconnected", 120)
            await until(lambda: worker.in_flight == 0 and not link.pending, "the orphans dropped", 60)
            events = await collect(await backend.submit(request(PROMPT, 6, deadline_s=None)))
            assert_complete(events, 6)
            assert worker.max_held <= 2

    run(main())


def test_a_list_of_addresses_fails_over_to_one_that_answers(broker: Broker) -> None:
    """Gateway and worker given a dead address first (a cluster node that is down) use the next."""
    engine = FakeBackend.counting(slots=1, step_s=0.001)
    dead = f"amqp://{broker.user}:{broker.password}@127.0.0.1:{free_ports(1)[0]}/"

    async def main() -> None:
        link = GatewayLink([dead, broker.url], [model := _model()])
        await link.start(60)
        stop = asyncio.Event()
        worker = Worker([dead, broker.url], model, engine)
        task = asyncio.ensure_future(worker.run(stop))
        try:
            backend = RemoteBackend(link, model, None)  # type: ignore[arg-type]
            await until(lambda: len(link.live_workers(model)) == 1, "the worker live", 60)
            assert_complete(await collect(await backend.submit(request(PROMPT, 5, deadline_s=None))), 5)
            assert link._session is not None and link._session.url == broker.url
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=30)
            await link.close()

    run(main())


async def _reply_queue_depth(url: str, name: str) -> int:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        return (await channel.declare_queue(name, passive=True)).declaration_result.message_count or 0


async def _delete_queue(url: str, name: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        await (await connection.channel()).queue_delete(name)


def test_replies_lost_with_the_reply_queue_are_sent_again(broker: Broker) -> None:
    """The last replies of a request wait in the gateway's reply queue while its link is down, and the
    worker, done, has acked the request; then the queue is lost (as a broker restart loses it: it is
    not durable). The gateway, connected again, finds its reply queue gone and sends the request
    again once no worker has asked about it: the client gets every token exactly once, not a hang."""
    engine = held_engine(slots=1)

    async def main() -> None:
        async with cluster(broker, _model(), [engine]) as (backend, workers):
            link, worker = backend.link, workers[0][0]
            link.lost_replies_grace_s = 0.5
            stream = await backend.submit(request(PROMPT, 12, deadline_s=None))
            task = asyncio.ensure_future(collect(stream))
            await until(lambda: len(engine.holding) == 1, "the stream held mid-way")
            assert link._session is not None and link._conn is not None
            reconnect, setup = asyncio.Event(), link._session._setup

            async def held_setup(conn: Any) -> None:
                await reconnect.wait()
                await setup(conn)

            link._session._setup = held_setup
            await link._conn.close()
            await until(lambda: not link.connected, "the gateway's link down")
            engine.gate.set()  # the worker finishes; its last replies wait in the reply queue
            await until(lambda: worker.in_flight == 0, "the worker done with it")
            assert await _reply_queue_depth(broker.url, link.reply_name) >= 1
            await _delete_queue(broker.url, link.reply_name)
            reconnect.set()
            events = await asyncio.wait_for(task, 60)
            assert_complete(events, 12)
            assert link.counters["resubmitted"] == 1

    run(main())
