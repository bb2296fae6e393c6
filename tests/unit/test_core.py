"""EngineCore and EngineClient with a fake runner: the thread loop, async and blocking streams,
immediate QueueFull, aborts from the caller's side, engine-thread jobs and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from fake_runner import FakeRunner, reference_tokens

from outpost.messages import FinishReason, GenerateRequest, QueueFull, TokenEvent
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import RunnerOutput, SchedulerOutput
from outpost.serving.engine_core import STEP_DELAY_ENV, EngineClient, EngineCore, step_delay_from_env


class SlowFakeRunner(FakeRunner):
    """A fake runner whose steps take a little time, like a decode; records its thread."""

    def __init__(self, delay: float = 0.002) -> None:
        super().__init__()
        self.delay = delay
        self.threads: set[str] = set()
        self.closed = False
        self.gate = threading.Event()  # cleared: every step waits here (the engine is held)
        self.gate.set()

    def warmup(self) -> None:
        self.threads.add(threading.current_thread().name)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.threads.add(threading.current_thread().name)
        assert self.gate.wait(30), "a test held the engine for too long"
        time.sleep(self.delay)
        return super().execute(out)

    def close(self) -> None:
        self.closed = True


def _core(runner: FakeRunner, slots: int = 2, max_queue: int = 4) -> EngineCore:
    config = SchedulerConfig(
        n_slots=slots, n_ctx=512, n_ctx_seq=256, max_queue=max_queue, step_token_budget=64
    )
    return EngineCore(Scheduler(config), runner)


def test_blocking_stream_gives_the_reference_tokens() -> None:
    runner = SlowFakeRunner()
    core = _core(runner)
    try:
        events = list(EngineClient(core).generate_sync(GenerateRequest([5, 6, 7], max_tokens=10)))
        tokens = [t for e in events for t in e.token_ids]
        assert tokens == reference_tokens([5, 6, 7], 10)
        assert events[-1].finish_reason is FinishReason.LENGTH and events[-1].timings is not None
        assert runner.threads == {"outpost-engine"}, "only the engine thread drives the runner"
    finally:
        core.stop()
    assert runner.closed


def test_async_streams_run_together_and_early_exit_aborts() -> None:
    core = _core(SlowFakeRunner(), slots=4)
    client = EngineClient(core)

    async def full(i: int) -> int:
        return sum([len(e.token_ids) async for e in client.open(GenerateRequest([i + 1, 2], max_tokens=20))])

    async def leave_early() -> None:
        stream = client.open(GenerateRequest([9, 9], max_tokens=200))
        async for _ in stream:
            break  # the caller goes away after one event
        await stream.aclose()

    async def main() -> list[int]:
        counts = await asyncio.wait_for(asyncio.gather(*(full(i) for i in range(3)), leave_early()), 10)
        return [c for c in counts if c is not None]

    try:
        assert asyncio.run(main()) == [20, 20, 20]
        deadline = time.monotonic() + 5
        while core.scheduler.slots_busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert core.scheduler.slots_busy == 0
    finally:
        core.stop()


def test_queue_full_is_raised_at_submit() -> None:
    runner = SlowFakeRunner()
    runner.gate.clear()  # held: nothing finishes while we fill the queue, however slow this thread is
    core = _core(runner, slots=1, max_queue=1)
    seen: list[TokenEvent] = []
    try:
        core.submit(GenerateRequest([1, 2], max_tokens=50), seen.append)
        core.submit(GenerateRequest([1, 3], max_tokens=50), seen.append)
        with pytest.raises(QueueFull):
            core.submit(GenerateRequest([1, 4], max_tokens=50), seen.append)
    finally:
        runner.gate.set()
        core.stop()
    finished = [e for e in seen if e.finished]
    assert len(finished) >= 2 and all(e.finish_reason is not None for e in finished)


def test_jobs_run_on_the_engine_thread() -> None:
    runner = SlowFakeRunner()
    core = _core(runner)
    try:
        assert (
            core.run_on_engine_thread(lambda: threading.current_thread().name).result(5) == "outpost-engine"
        )
        failing = core.run_on_engine_thread(lambda: 1 // 0)
        with pytest.raises(ZeroDivisionError):
            failing.result(5)
    finally:
        core.stop()


def test_build_runs_on_the_engine_thread_and_its_failure_reaches_the_caller() -> None:
    built_on: list[str] = []
    closed: list[bool] = []

    def build() -> tuple[Scheduler, FakeRunner]:
        built_on.append(threading.current_thread().name)
        config = SchedulerConfig(n_slots=1, n_ctx=64, n_ctx_seq=64, step_token_budget=8)
        return Scheduler(config), SlowFakeRunner()

    core = EngineCore.built_on_thread(build, on_close=lambda: closed.append(True))
    try:
        assert built_on == ["outpost-engine"], "the model loads where it will be decoded"
        events = list(EngineClient(core).generate_sync(GenerateRequest([5, 6], max_tokens=3)))
        assert [t for e in events for t in e.token_ids] == reference_tokens([5, 6], 3)
    finally:
        core.stop()
    assert closed == [True]

    def failing() -> tuple[Scheduler, FakeRunner]:
        raise ValueError("model file is not a GGUF")

    with pytest.raises(ValueError, match="not a GGUF"):
        EngineCore.built_on_thread(failing)


def test_the_debug_step_delay_paces_every_decoding_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """OUTPOST_DEBUG_STEP_DELAY_MS: a floor on each step's time (tests hold the engine with it)."""
    monkeypatch.setenv(STEP_DELAY_ENV, "20")
    assert step_delay_from_env() == pytest.approx(0.02)
    core = _core(SlowFakeRunner(delay=0.0))
    try:
        assert core.step_delay == pytest.approx(0.02)
        started = time.monotonic()
        events = list(EngineClient(core).generate_sync(GenerateRequest([5, 6], max_tokens=10)))
        elapsed = time.monotonic() - started
    finally:
        core.stop()
    assert [t for e in events for t in e.token_ids] == reference_tokens([5, 6], 10)
    assert elapsed >= 10 * 0.02, "ten decoding steps, each held for 20 ms at least"
    for bad in ("soon", "-5", "1e9"):
        monkeypatch.setenv(STEP_DELAY_ENV, bad)
        with pytest.raises(ValueError, match=STEP_DELAY_ENV):
            step_delay_from_env()
    monkeypatch.delenv(STEP_DELAY_ENV)
    assert step_delay_from_env() == 0.0


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts the wake-ups other threads ask of it."""

    def __init__(self) -> None:
        super().__init__()
        self.threadsafe_calls = 0

    def call_soon_threadsafe(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_a_steps_events_reach_one_loop_in_one_wake_up_in_order() -> None:
    """Four streams on one loop, 8 tokens each: one call_soon_threadsafe per step that had events
    for it (not one per stream), and every stream's events arrive whole and in order."""
    loop = CountingLoop()
    core = _core(SlowFakeRunner(), slots=4)
    client = EngineClient(core)

    async def tokens(i: int) -> list[int]:
        return [t async for e in client.open(GenerateRequest([i + 1, 2], max_tokens=8)) for t in e.token_ids]

    async def main() -> list[list[int]]:
        return await asyncio.wait_for(asyncio.gather(*(tokens(i) for i in range(4))), 10)

    try:
        got = loop.run_until_complete(main())
        steps = core.steps
    finally:
        core.stop()
        loop.close()
    assert got == [reference_tokens([i + 1, 2], 8) for i in range(4)]
    assert 0 < loop.threadsafe_calls <= steps < 4 * 8


def test_deliver_batches_per_loop_and_calls_plain_sinks_directly() -> None:
    from outpost.serving.engine_core import LoopSink, deliver

    loops = [CountingLoop(), CountingLoop()]
    queues = [asyncio.Queue[TokenEvent]() for _ in range(3)]
    plain: list[TokenEvent] = []
    sinks = [LoopSink(loops[0], queues[0]), LoopSink(loops[0], queues[1]), LoopSink(loops[1], queues[2])]
    events = [TokenEvent(f"r{i}", token_ids=[i]) for i in range(5)]
    try:
        deliver([(sinks[0], events[0]), (sinks[1], events[1]), (None, events[2])])
        deliver([(sinks[2], events[3]), (plain.append, events[4]), (sinks[0], events[2])])
        assert [loop.threadsafe_calls for loop in loops] == [2, 1]
        assert plain == [events[4]]
        for loop in loops:
            loop.run_until_complete(asyncio.sleep(0))
        assert [q.get_nowait() for _ in range(2) for q in queues[:1]] == [events[0], events[2]]
        assert queues[1].get_nowait() == events[1] and queues[2].get_nowait() == events[3]
    finally:
        for loop in loops:
            loop.close()
    deliver([(sinks[0], events[0])])  # a closed loop's events are dropped, not an error
