"""Gateway link + workers over a real broker, with fake engines (no model).

Token i of a request is its position in the sequence, so a stream resumed on another worker must
continue with exactly the next positions: any repeated or missing token shows. The scripted engine
runs the real scheduler over text pieces the test chose, for stop strings across a resume point.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from fake_backend import FakeBackend
from scripted_backend import ScriptedRunner, scripted_backend

from outpost.cluster import wire
from outpost.cluster.broker import topology
from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.worker.service import Worker
from outpost.messages import BackendUnavailable, FinishReason, GenerateRequest, QueueFull, TokenEvent
from outpost.serving.engine_core import EngineClient

pytestmark = pytest.mark.cluster
LIMIT_S = 60.0


def _model() -> str:
    return "test-" + uuid.uuid4().hex[:8]


CLEANUP_S = 15.0


def run(coro: Awaitable[Any]) -> Any:
    """`coro` within LIMIT_S; then what it left running is cancelled and given CLEANUP_S to end.
    One that does not end is a warning, not a hang (asyncio.run would wait on it forever)."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro, LIMIT_S))
    finally:
        left = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in left:
            task.cancel()
        if left:
            _, pending = loop.run_until_complete(asyncio.wait(left, timeout=CLEANUP_S))
            if pending:
                warnings.warn(f"tasks still running {CLEANUP_S:g} s after the test: {pending}", stacklevel=2)
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


@contextlib.asynccontextmanager
async def cluster(
    broker: Any, model: str, engines: list[Any], request_timeout: float = 60.0, max_queue: int | None = None
) -> AsyncIterator[tuple[RemoteBackend, list[tuple[Worker, asyncio.Event, asyncio.Task[None]]]]]:
    link = GatewayLink(broker.url, [model], max_queue=max_queue)
    await link.start()
    workers = []
    for engine in engines:
        worker = Worker(broker.url, model, engine)
        stop = asyncio.Event()
        workers.append((worker, stop, asyncio.ensure_future(worker.run(stop))))
    backend = RemoteBackend(link, model, None, request_timeout=request_timeout)  # type: ignore[arg-type]
    try:
        await until(lambda: len(link.live_workers(model)) == len(engines), "workers live")
        yield backend, workers
    finally:
        for _, stop, task in workers:
            stop.set()
            task.cancel()
            await asyncio.wait({task}, timeout=30)  # its end, never our own cancellation
        await link.close()


async def until(cond: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def request(n_prompt: int = 3, max_tokens: int = 20, deadline_s: float | None = 60.0) -> GenerateRequest:
    now = time.monotonic()
    return GenerateRequest(
        prompt_tokens=list(range(100, 100 + n_prompt)),
        max_tokens=max_tokens,
        deadline=None if deadline_s is None else now + deadline_s,
    )


async def collect(stream: Any, on_event: Callable[[TokenEvent], None] | None = None) -> list[TokenEvent]:
    events = []
    async for event in stream:
        events.append(event)
        if on_event is not None:
            on_event(event)
    return events


def tokens(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def test_streams_spread_over_workers(rabbitmq: Any) -> None:
    broker = rabbitmq
    engines = [FakeBackend.counting(slots=2, step_s=0.005), FakeBackend.counting(slots=2, step_s=0.005)]

    async def main() -> None:
        async with cluster(broker, _model(), engines) as (backend, _):
            reqs = [request(n_prompt=3, max_tokens=12) for _ in range(8)]
            streams = [await backend.submit(r) for r in reqs]
            results = await asyncio.gather(*(collect(s) for s in streams))
            for events in results:
                assert tokens(events) == list(range(3, 15))
                assert events[-1].finish_reason is FinishReason.LENGTH
                assert sum(e.finished for e in events) == 1

    run(main())
    assert engines[0].started and engines[1].started  # pull balancing used both


def test_worker_death_mid_stream_resumes_on_another(rabbitmq: Any) -> None:
    broker = rabbitmq
    slow, other = FakeBackend.counting(slots=1, step_s=0.05), FakeBackend.counting(slots=1, step_s=0.005)

    async def main() -> None:
        async with cluster(broker, _model(), [slow]) as (backend, workers):
            seen: list[int] = []
            stream = await backend.submit(request(n_prompt=4, max_tokens=30))
            task = asyncio.ensure_future(collect(stream, lambda e: seen.extend(e.token_ids)))
            await until(lambda: len(seen) >= 5, "first tokens")
            # The worker dies: its connection drops with the request unacked.
            workers[0][2].cancel()
            await asyncio.wait({workers[0][2]}, timeout=30)  # its end, never our own cancellation
            stop = asyncio.Event()
            rescuer = asyncio.ensure_future(Worker(broker.url, backend.model, other).run(stop))
            try:
                events = await task
            finally:
                stop.set()
                await rescuer
            assert tokens(events) == list(range(4, 34))  # nothing repeated, nothing missing
            assert events[-1].finish_reason is FinishReason.LENGTH
            assert backend.link.counters["resumes"] == 1

    run(main())
    assert other.started


def test_cancel_reaches_the_worker(rabbitmq: Any) -> None:
    broker = rabbitmq
    engine = FakeBackend.counting(slots=1, step_s=0.05)

    async def main() -> None:
        async with cluster(broker, _model(), [engine]) as (backend, workers):
            stream = await backend.submit(request(max_tokens=1000))
            agen = stream.__aiter__()
            await agen.__anext__()
            await agen.aclose()  # the client went away
            worker = workers[0][0]
            await until(lambda: not worker.in_flight, "slot freed", timeout=5.0)

    run(main())


def test_expired_in_queue_is_a_timeout(rabbitmq: Any) -> None:
    broker = rabbitmq

    async def main() -> None:
        async with cluster(broker, _model(), []) as (backend, _):
            stream = await backend.submit(request(deadline_s=0.3))
            events = await collect(stream)
            assert [e.finish_reason for e in events] == [FinishReason.TIMEOUT]

    run(main())


def test_queue_full_is_rejected(rabbitmq: Any) -> None:
    broker = rabbitmq
    model = _model()

    async def main() -> None:
        applied = await topology.apply_length_policy(broker.url, broker.mgmt_url, [model], 2)
        assert applied
        async with cluster(broker, model, [], max_queue=2) as (backend, _):
            await backend.submit(request())
            await backend.submit(request())
            with pytest.raises(QueueFull):
                for _ in range(3):  # a quorum queue takes one message past its limit
                    await backend.submit(request())

    run(main())


def test_no_broker_is_unavailable_at_once() -> None:
    async def main() -> None:
        link = GatewayLink("amqp://guest:guest@127.0.0.1:1/", ["m"])
        with pytest.raises(BackendUnavailable):
            await link.start(connect_timeout=0.5)
        with pytest.raises(BackendUnavailable):
            await link.submit("m", request())
        with pytest.raises(BackendUnavailable):
            await RemoteBackend(link, "m", None).embed(["x"])  # type: ignore[arg-type]

    run(main())


def test_poison_request_fails_once_after_the_delivery_limit(rabbitmq: Any) -> None:
    """A request whose worker dies every time ends with one error, not endless redeliveries."""
    broker = rabbitmq
    engine = FakeBackend.counting(slots=1, step_s=0.05)

    async def main() -> None:
        async with cluster(broker, _model(), []) as (backend, _):
            stream = await backend.submit(request(max_tokens=1000))
            collected = asyncio.ensure_future(collect(stream))
            kills = 0
            while not collected.done() and kills < 10:
                started = len(engine.started)
                stop = asyncio.Event()
                task = asyncio.ensure_future(Worker(broker.url, backend.model, engine).run(stop))
                await asyncio.wait(
                    {
                        collected,
                        asyncio.ensure_future(until(lambda n=started: len(engine.started) > n, "run")),
                    },
                    return_when=asyncio.FIRST_COMPLETED,
                )
                task.cancel()  # the worker dies with the request unacked
                await asyncio.wait({task}, timeout=30)  # its end, never our own cancellation
                kills += 1
            events = await asyncio.wait_for(collected, 30)
            finals = [e for e in events if e.finished]
            assert len(finals) == 1 and finals[0].finish_reason is FinishReason.ERROR
            assert "poison" in (finals[0].error or "")
            assert kills <= topology.DELIVERY_LIMIT + 2

    run(main())


def test_a_cancelled_consumer_is_re_established(rabbitmq: Any) -> None:
    """aio-pika does not surface a consumer cancelled under it; the worker's watchdog consumes again."""
    broker = rabbitmq
    engine = FakeBackend.counting(slots=1, step_s=0.005)

    async def main() -> None:
        async with cluster(broker, _model(), [engine]) as (backend, workers):
            worker = workers[0][0]
            intake = worker.served[worker.model].intake
            assert intake is not None
            credit = intake.plan.credits[0]  # one slot: one consumer, on the shared queue
            underlay = await intake._channel.get_underlay_channel()
            old_tag = credit.tag
            assert old_tag is not None
            await underlay.basic_cancel(old_tag)  # behind aio-pika's back, as a broker cancel is
            await until(lambda: credit.tag not in (None, old_tag), "a new consumer", timeout=10.0)
            events = await collect(await backend.submit(request(max_tokens=5)))
            assert tokens(events) == list(range(3, 8))

    run(main())


async def kill(worker: tuple[Worker, asyncio.Event, asyncio.Task[None]]) -> None:
    """The worker dies: its connection drops with what it holds unacked."""
    worker[2].cancel()
    await asyncio.wait({worker[2]}, timeout=30)  # its end, never our own cancellation


async def queue_depth(backend: RemoteBackend) -> int:
    queue = await backend.link._side.declare_queue(topology.request_queue(backend.model), passive=True)
    return int(queue.declaration_result.message_count or 0)


def test_embeddings_through_a_worker(rabbitmq: Any) -> None:
    engine = FakeBackend.counting(slots=2)

    async def main() -> None:
        async with cluster(rabbitmq, _model(), [engine]) as (backend, _):
            vectors, n_tokens = await backend.embed(["a red apple", "pear"])
            assert vectors == [[11.0, 0.0], [4.0, 1.0]] and n_tokens == 4
            with pytest.raises(ValueError, match="input 1 has 60 characters"):  # serve's 400
                await backend.embed(["ok", "x" * 60])
            assert len(backend.link.embeds) == 0

    run(main())
    assert engine.embedded == [["a red apple", "pear"], ["ok", "x" * 60]]


def test_worker_killed_mid_embedding_is_redelivered_and_answered_once(rabbitmq: Any) -> None:
    held, other = FakeBackend.counting(slots=1), FakeBackend.counting(slots=1)
    texts = ["one", "two words"]

    async def main() -> None:
        gate = held.embed_gate = asyncio.Event()
        async with cluster(rabbitmq, _model(), [held]) as (backend, workers):
            call = asyncio.ensure_future(backend.embed(texts))
            await until(lambda: bool(held.embedded), "the job held by the first worker")
            await kill(workers[0])
            stop = asyncio.Event()
            rescuer = Worker(rabbitmq.url, backend.model, other)
            rescuing = asyncio.ensure_future(rescuer.run(stop))
            try:
                vectors, n_tokens = await call
                await until(lambda: rescuer.completed == 1, "the rescuer's ack")
            finally:
                gate.set()  # the dead worker's copy ends; with its connection gone it cannot reply
                stop.set()
                await rescuing
            assert vectors == [[3.0, 0.0], [9.0, 1.0]] and n_tokens == 3
            assert len(backend.link.embeds) == 0
            # Acked: with the rescuer gone too, nothing came back to the queue.
            assert await queue_depth(backend) == 0

    run(main())
    assert held.embedded == [texts] and other.embedded == [texts]


def test_embedding_expired_in_queue_is_a_timeout(rabbitmq: Any) -> None:
    async def main() -> None:
        async with cluster(rabbitmq, _model(), [], request_timeout=0.3) as (backend, _):
            with pytest.raises(TimeoutError, match="deadline passed in the queue"):  # the broker's verdict
                await backend.embed(["x"])
            assert len(backend.link.embeds) == 0

    run(main())


def test_embedding_to_a_full_queue_is_rejected(rabbitmq: Any) -> None:
    model = _model()

    async def main() -> None:
        assert await topology.apply_length_policy(rabbitmq.url, rabbitmq.mgmt_url, [model], 2)
        async with cluster(rabbitmq, model, [], max_queue=2) as (backend, _):
            with pytest.raises(QueueFull):
                for _ in range(5):  # chat requests fill it (a quorum queue takes one past its limit)
                    await backend.submit(request())
            with pytest.raises(QueueFull):
                await backend.embed(["x"])
            assert len(backend.link.embeds) == 0

    run(main())


PROMPT_LEN = 3


@pytest.mark.parametrize(
    ("outputs", "stop", "hold_at", "expected"),
    [
        ([b"Hel", b"lo ", b"wor", b"ld ", b"ST", b"OP", b"!"], ("STOP",), 5, "Hello world "),
        ([b"caf", b"\xc3", b"\xa9 ", b"ok"], (), 2, "caf\u00e9 ok"),
    ],
    ids=["stop string", "utf-8 character"],
)
def test_text_split_across_the_resume_point_is_as_uninterrupted(
    rabbitmq: Any, outputs: list[bytes], stop: tuple[str, ...], hold_at: int, expected: str
) -> None:
    """The first worker dies after `hold_at` outputs, with part of the stop string (or of a
    character) held back; the stream resumed on another worker shows what one run would."""
    held = scripted_backend(ScriptedRunner(PROMPT_LEN, outputs, hold_at=hold_at))
    free = scripted_backend(ScriptedRunner(PROMPT_LEN, outputs))
    prompt = list(range(100, 100 + PROMPT_LEN))
    reference = list(EngineClient(free.engine.core).generate_sync(GenerateRequest(prompt, 20, stop=stop)))
    assert "".join(e.text for e in reference) == expected

    async def main() -> list[TokenEvent]:
        async with cluster(rabbitmq, _model(), [held]) as (backend, workers):
            seen: list[int] = []
            stream = await backend.submit(
                GenerateRequest(prompt, 20, stop=stop, deadline=time.monotonic() + 60)
            )
            task = asyncio.ensure_future(collect(stream, lambda e: seen.extend(e.token_ids)))
            await until(lambda: len(seen) == hold_at, "the outputs before the hold")
            await kill(workers[0])
            stopping = asyncio.Event()
            rescuer = asyncio.ensure_future(Worker(rabbitmq.url, backend.model, free).run(stopping))
            try:
                events = await task
            finally:
                stopping.set()
                await rescuer
                held.close()  # the dead worker's engine goes on; its replies cannot go out
            assert backend.link.counters["resumes"] == 1
            return events

    try:
        events = run(main())
    finally:
        held.close()
        free.close()
    assert "".join(e.text for e in events) == expected
    assert tokens(events) == tokens(reference)
    assert events[-1].finish_reason is reference[-1].finish_reason


@pytest.mark.parametrize("gateway_reads_bundles", [True, False])
def test_replies_come_bundled_only_to_a_gateway_that_reads_bundles(
    rabbitmq: Any, monkeypatch: pytest.MonkeyPatch, gateway_reads_bundles: bool
) -> None:
    """A worker bundles its replies for a gateway that says it reads them (`reply_bundles` on the
    request); a gateway from before bundles gets one `events` message per request and step. Either
    way every stream arrives whole and in order."""
    encode_request, decode_bundle = wire.encode_request, wire.decode_bundle
    bundles: list[int] = []

    def older_gateway(req: GenerateRequest) -> bytes:
        obj = json.loads(encode_request(req))
        del obj["reply_bundles"]
        return json.dumps(obj).encode()

    def counting(body: bytes) -> list[wire.ReplyBatch]:
        batches = decode_bundle(body)
        bundles.append(len(batches))
        return batches

    if not gateway_reads_bundles:
        monkeypatch.setattr(wire, "encode_request", older_gateway)
    monkeypatch.setattr(wire, "decode_bundle", counting)
    engines = [FakeBackend.counting(slots=4, step_s=0.005)]

    async def main() -> None:
        async with cluster(rabbitmq, _model(), engines) as (backend, _):
            streams = [await backend.submit(request(n_prompt=3, max_tokens=12)) for _ in range(4)]
            for events in await asyncio.gather(*(collect(s) for s in streams)):
                assert tokens(events) == list(range(3, 15))
                assert sum(e.finished for e in events) == 1

    run(main())
    assert bool(bundles) is gateway_reads_bundles
