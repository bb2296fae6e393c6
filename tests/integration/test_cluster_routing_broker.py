"""Prefix-aware routing over a real broker: lanes, spill, a death in a lane, the slot bound.

Fake engines (no model): a counting FakeBackend "holds" in its KV the prompts it ran (its last `slots`),
advertises their block hashes in its heartbeat, and emits token i of a request as its position,
so a stream handed to another worker must continue with exactly the next positions.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import pytest
from fake_backend import FakeBackend
from test_cluster_broker import LIMIT_S, collect, run, tokens, until

from outpost.cluster.broker import topology
from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.prefix import BLOCK
from outpost.cluster.worker.service import Worker
from outpost.messages import FinishReason, GenerateRequest

pytestmark = pytest.mark.cluster
SYSTEM = [random.Random(5).randrange(1000, 40_000) for _ in range(5 * BLOCK)]  # a 320-token prefix


def prompt(tail: int, system: list[int] = SYSTEM) -> list[int]:
    return [*system, 7, tail, 9]


def req(tokens_: list[int], max_tokens: int = 10) -> GenerateRequest:
    return GenerateRequest(tokens_, max_tokens, deadline=time.monotonic() + LIMIT_S)


class Fleet:
    """Gateway links and workers on one model; workers can be added and killed one by one."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.model = "route-" + uuid.uuid4().hex[:8]
        self.links: list[GatewayLink] = []
        self.workers: dict[str, tuple[Worker, asyncio.Task[None]]] = {}

    async def gateway(self) -> RemoteBackend:
        link = GatewayLink(self.broker.url, [self.model])
        await link.start()
        self.links.append(link)
        return RemoteBackend(link, self.model, None)  # type: ignore[arg-type]

    async def worker(self, name: str, engine: FakeBackend) -> Worker:
        worker = Worker(self.broker.url, self.model, engine, worker_id=f"{name}-{uuid.uuid4().hex[:4]}")
        self.workers[name] = (worker, asyncio.ensure_future(worker.run(asyncio.Event())))

        def live() -> bool:
            return all((worker.worker_id, self.model) in link.fleet.workers for link in self.links)

        await until(live, f"{name} live")
        return worker

    async def kill(self, name: str) -> None:
        """Its connection drops with what it holds unacked, as a SIGKILL does."""
        _, task = self.workers.pop(name)
        task.cancel()
        await asyncio.wait({task}, timeout=30)  # its end, never our own cancellation

    async def holder(self, name: str, engine: FakeBackend, gateway: RemoteBackend) -> Worker:
        """A worker holding SYSTEM in its KV (a first request placed on it), in every gateway's view."""
        worker = await self.worker(name, engine)
        await collect(await gateway.submit(req(prompt(0), max_tokens=2)))
        await self.advertised(worker, 5)
        return worker

    async def advertised(self, worker: Worker, min_blocks: int) -> None:
        await until(
            lambda: all(
                len(link.fleet.workers[worker.worker_id, self.model].heartbeat.prefixes) >= min_blocks
                for link in self.links
            ),
            "the prefix in every gateway's view",
        )

    async def close(self) -> None:
        for name in list(self.workers):
            await self.kill(name)
        for link in self.links:
            await link.close()


@contextlib.asynccontextmanager
async def fleet(broker: Any) -> AsyncIterator[Fleet]:
    f = Fleet(broker)
    try:
        yield f
    finally:
        await f.close()


def test_a_held_prefix_lands_on_its_holder_from_every_gateway(rabbitmq: Any) -> None:
    a, b = FakeBackend.counting(slots=4, step_s=0.002), FakeBackend.counting(slots=4, step_s=0.002)

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateways = [await f.gateway(), await f.gateway()]
            wa, _ = await f.worker("a", a), await f.worker("b", b)
            await collect(await gateways[0].submit(req(prompt(0))))  # placed on one of them
            holder, other = (a, b) if a.started else (b, a)
            holder_worker = wa if holder is a else f.workers["b"][0]
            await f.advertised(holder_worker, 5)
            before = len(holder.started)
            for wave in range(3):  # four at a time: the holder's slots (a longer burst may spill)
                streams = [await gateways[i % 2].submit(req(prompt(4 * wave + i + 1))) for i in range(4)]
                results = await asyncio.gather(*(collect(s) for s in streams))
                assert all(r[-1].finish_reason is FinishReason.LENGTH for r in results)
            assert len(holder.started) - before == 12 and len(other.started) == 0
            assert sum(link.counters["routed_prefix"] for link in f.links) == 12

    run(main())


def test_short_prompts_are_pulled_from_the_shared_queue_by_everyone(rabbitmq: Any) -> None:
    engines = [FakeBackend.counting(slots=2, step_s=0.005), FakeBackend.counting(slots=2, step_s=0.005)]

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            for i, engine in enumerate(engines):
                await f.worker(f"w{i}", engine)
            streams = [await gateway.submit(req([5, 6, i], 12)) for i in range(8)]
            await asyncio.gather(*(collect(s) for s in streams))
            assert f.links[0].counters["routed_shared"] == 8

    run(main())
    assert engines[0].started and engines[1].started


def test_a_busy_holders_affine_request_spills_to_another_worker(rabbitmq: Any) -> None:
    busy = FakeBackend.counting(slots=2, step_s=0.05)
    idle = FakeBackend.counting(slots=2, step_s=0.002)

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            holder = await f.worker("holder", busy)
            long_runs = [await gateway.submit(req(prompt(i), max_tokens=400)) for i in range(2)]
            await until(lambda: busy.running == 2, "the holder's two slots busy")
            await f.advertised(holder, 5)
            await f.worker("idle", idle)
            started = time.monotonic()
            events = await collect(await gateway.submit(req(prompt(99), max_tokens=5)))
            waited = time.monotonic() - started
            assert f.links[0].counters["routed_prefix"] >= 1
            assert len(idle.started) == 1, "spilled from the holder's lane to the shared queue"
            assert tokens(events) == list(range(len(prompt(99)), len(prompt(99)) + 5))
            assert waited < LIMIT_S / 2
            for stream in long_runs:
                await stream.aclose()

    run(main())


def test_a_worker_killed_holding_a_lane_request_hands_it_over_exactly(rabbitmq: Any) -> None:
    first = FakeBackend.counting(slots=2, step_s=0.02)
    second = FakeBackend.counting(slots=2, step_s=0.002)

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            await f.holder("first", first, gateway)
            await f.worker("second", second)
            seen: list[int] = []
            stream = await gateway.submit(req(prompt(1), max_tokens=60))
            task = asyncio.ensure_future(collect(stream, lambda e: seen.extend(e.token_ids)))
            await until(lambda: len(seen) >= 10, "ten tokens from the holder")
            assert len(first.started) == 2
            await f.kill("first")
            events = await asyncio.wait_for(task, LIMIT_S)
            n = len(prompt(1))
            assert tokens(events) == list(range(n, n + 60)), "no token repeated or missing"
            assert sum(e.finished for e in events) == 1 and second.started

    run(main())


def test_a_stream_that_lost_its_lane_worker_resumes_before_the_queued_ones(rabbitmq: Any) -> None:
    """Interrupted first: the request a dead worker held in its lane goes to the resume queue, which
    the other worker takes beside its busy slot, ahead of the two requests waiting in the shared
    queue (before, it was dead-lettered behind them and waited for both)."""
    n = len(prompt(1))
    holder_engine = FakeBackend.counting(slots=1, step_s=0.005)
    holder_engine.hold_at = n + 3  # the lane request holds mid-way, 3 tokens sent
    other_engine = FakeBackend.counting(slots=1, step_s=0.005)
    other_engine.hold_at = 4  # everything it runs holds after a first token until its gate opens

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            holder = await f.holder("holder", holder_engine, gateway)
            lane_request = req(prompt(1), max_tokens=30)
            seen: list[int] = []
            stream = await gateway.submit(lane_request)
            task = asyncio.ensure_future(collect(stream, lambda e: seen.extend(e.token_ids)))
            await until(lambda: bool(holder_engine.holding) and len(seen) == 3, "the lane request mid-way")
            assert f.links[0].counters["routed_prefix"] == 1  # to the holder's lane
            await f.worker("other", other_engine)
            fresh = [req([3, 4, i], max_tokens=3) for i in range(3)]
            streams = [await gateway.submit(r) for r in fresh]
            await until(lambda: bool(other_engine.holding), "the other worker's slot busy")
            await until_ready(f, holder, topology.request_queue(f.model), 2)  # both wait there
            await f.kill("holder")
            rid = lane_request.request_id
            try:
                await until(lambda: rid in other_engine.started, "the interrupted request resumed", 60)
            except AssertionError as exc:
                raise AssertionError(f"{exc}; ready: {await _ready(f, holder)}") from None
            assert other_engine.started == [fresh[0].request_id, rid], "resumed before the waiting ones"
            other_engine.gate.set()
            events = await asyncio.wait_for(task, LIMIT_S)
            assert tokens(events) == list(range(n, n + 30)), "no token repeated or missing"
            for result in await asyncio.gather(*(collect(s) for s in streams)):
                assert result[-1].finish_reason is FinishReason.LENGTH
            assert other_engine.started[2:] == [fresh[1].request_id, fresh[2].request_id]

    run(main())


def test_a_worker_with_free_slots_submits_a_resumed_request_before_fresh_ones(rabbitmq: Any) -> None:
    """A worker started after a lane's holder died takes the interrupted request (resume queue) and
    two waiting ones (shared queue) at once; the fresh ones wait for its `resume?` answer, so the
    interrupted one reaches the engine first (else they would, and could take the free slots)."""
    n = len(prompt(1))
    holder_engine = FakeBackend.counting(slots=1, step_s=0.005)
    holder_engine.hold_at = n + 3
    later_engine = FakeBackend.counting(slots=2, step_s=0.005)

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            holder = await f.holder("holder", holder_engine, gateway)
            lane_request = req(prompt(1), max_tokens=30)
            task = asyncio.ensure_future(collect(await gateway.submit(lane_request)))
            await until(lambda: bool(holder_engine.holding), "the lane request mid-way")
            fresh = [req([3, 4, i], max_tokens=3) for i in range(2)]
            streams = [await gateway.submit(r) for r in fresh]
            shared, resume = topology.request_queue(f.model), topology.resume_queue(f.model)
            await until_ready(f, holder, shared, 2)  # both wait: the holder's only credit is busy
            await f.kill("holder")
            await until_ready(f, holder, resume, 1)  # the lane's request, dead-lettered there
            await f.worker("later", later_engine)
            await until(lambda: len(later_engine.started) == 3, "all three taken")
            assert later_engine.started[0] == lane_request.request_id
            events = await asyncio.wait_for(task, LIMIT_S)
            assert tokens(events) == list(range(n, n + 30)), "no token repeated or missing"
            for result in await asyncio.gather(*(collect(s) for s in streams)):
                assert result[-1].finish_reason is FinishReason.LENGTH

    run(main())


async def until_ready(f: Fleet, holder: Worker, queue: str, n: int) -> None:
    """Until `n` messages are ready in `queue`: a broker count polled every 20 ms, at most 30 s."""
    for _ in range(1500):
        if (await _ready(f, holder))[queue] == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never {n} ready in {queue}: {await _ready(f, holder)}")


async def _ready(f: Fleet, holder: Worker) -> dict[str, int]:
    """Messages ready in the model's queues and the holder's lane: where a request that went is."""
    channel = await f.links[0]._conn.channel()  # type: ignore[union-attr]
    names = [topology.request_queue(f.model), topology.resume_queue(f.model)]
    names.append(topology.lane_queue(f.model, holder.worker_id))
    try:
        ready = {}
        for name in names:
            queue = await channel.declare_queue(name, passive=True)
            ready[name] = int(queue.declaration_result.message_count or 0)
        return ready
    finally:
        await channel.close()


def test_a_worker_never_holds_more_requests_than_slots(rabbitmq: Any) -> None:
    engine = FakeBackend.counting(slots=3, step_s=0.01)

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateways = [await f.gateway(), await f.gateway()]
            w = await f.worker("only", engine)
            await collect(await gateways[0].submit(req(prompt(0), max_tokens=2)))
            await f.advertised(w, 5)
            mixed = [prompt(i) if i % 2 else [3, 4, i] for i in range(16)]
            streams = [await gateways[i % 2].submit(req(p, 15)) for i, p in enumerate(mixed)]
            results = await asyncio.gather(*(collect(s) for s in streams))
            assert all(r[-1].finish_reason is FinishReason.LENGTH for r in results)
            routed = {
                k: sum(link.counters[k] for link in f.links) for k in ("routed_prefix", "routed_shared")
            }
            assert routed["routed_prefix"] >= 4 and routed["routed_shared"] >= 8  # a full lane spills

    run(main())
    assert engine.max_running <= 3


def test_a_worker_runs_all_its_slots_from_the_shared_queue(rabbitmq: Any) -> None:
    """Half the credits start on the lane; with only shared work they all move there, the last one
    too, once a request is seen waiting (a depth read on a consuming channel would say 0)."""
    engine = FakeBackend.counting(slots=4, step_s=0.05)

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            await f.worker("only", engine)
            streams = [await gateway.submit(req([3, 4, i], max_tokens=2000)) for i in range(4)]
            await until(lambda: engine.running == 4, "all four slots busy with shared requests")
            for stream in streams:
                await stream.aclose()

    run(main())


def test_a_worker_brings_its_lane_back_when_the_broker_removed_it(rabbitmq: Any) -> None:
    """A lane nobody consumes expires (x-expires: a dead worker's lane goes), and a live worker's lane
    may have no consumer for long: one slot (its credit reads the shared queue) or a busy shared
    queue that took every credit. Its depth probe declares the lane again as it was declared, which
    renews the lease and brings back a lane the broker removed; no probe may break the channel
    replies go out on (a passive declare of a vanished lane did, failing every stream after it).
    The broker's removal is done here at once (a queue delete), not by waiting out an expiry."""

    async def main() -> None:
        async with fleet(rabbitmq) as f:
            gateway = await f.gateway()
            worker = await f.worker("solo", FakeBackend.counting(slots=1, step_s=0.005))
            lane = topology.lane_queue(f.model, worker.worker_id)
            conn = await aio_pika.connect(rabbitmq.url)
            try:
                await (await conn.channel()).queue_delete(lane)  # as the broker's expiry removes it

                async def lane_exists() -> bool:  # a passive declare of a missing queue is a 404
                    channel = await conn.channel()
                    try:
                        await channel.declare_queue(lane, passive=True)
                        return True
                    except aio_pika.exceptions.ChannelNotFoundEntity:
                        return False
                    finally:
                        if not channel.is_closed:
                            await channel.close()

                deadline = time.monotonic() + LIMIT_S
                while not await lane_exists():  # polled until the worker's probe declares it again
                    assert time.monotonic() < deadline, "the worker never declared its lane again"
                    await asyncio.sleep(0.05)
            finally:
                await conn.close()
            for tail in range(3):  # >= 256 tokens: placed on the worker's lane, then short ones
                p = prompt(tail) if tail == 0 else [5, 6, tail]
                events = await collect(await gateway.submit(req(p, 10)))
                assert tokens(events) == list(range(len(p), len(p) + 10))
                assert events[-1].finish_reason is FinishReason.LENGTH and events[-1].error is None

    run(main())
