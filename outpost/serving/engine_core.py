"""EngineCore: the one thread that owns the llama context; EngineClient: how everyone else talks to it.

Only this thread ever calls into llama.cpp's compute (decode, warmup, embedding jobs): a second
driving thread makes OpenMP throttle its spin-waits and every decode slows down ~3x on small CPUs.

The loop is vLLM v1's: `schedule()` -> `runner.execute()` -> `update_from_output()`, once per step,
admitting new requests between every step. Callers on other threads (the asyncio server, the CLI)
submit requests and aborts under a short lock around the pure scheduler and get `TokenEvent`s back
through a per-request sink; `llama_decode` runs outside the lock (ctypes releases the GIL there),
so submitting, aborting and serving HTTP never wait for a decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import Future
from typing import Protocol, TypeVar

from outpost.messages import FinishReason, GenerateRequest, TokenEvent
from outpost.scheduler import Scheduler
from outpost.scheduler.output import RunnerOutput, SchedulerOutput
from outpost.serving.follow_ups import FollowUps
from outpost.serving.step_profile import profile_from_env

_log = logging.getLogger(__name__)

EventSink = Callable[[TokenEvent], None]


class LoopSink:
    """A sink that puts events on an asyncio queue of one event loop. The core hands all of a
    step's events for one loop over in one `call_soon_threadsafe` (`deliver`): one wake-up of the
    loop per step, not one per stream, each of which woke the loop's thread to take the GIL back
    from the engine's while it was still handing out the step's other events."""

    __slots__ = ("loop", "queue")

    def __init__(self, loop: asyncio.AbstractEventLoop, events: asyncio.Queue[TokenEvent]) -> None:
        self.loop = loop
        self.queue = events

    def __call__(self, event: TokenEvent) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


def deliver(pairs: list[tuple[EventSink | None, TokenEvent]]) -> None:
    """Hands each event to its sink (None: a request that is gone), in order per sink; a closed
    loop's events are dropped, since nobody is left to read them."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[TokenEvent], TokenEvent]]] = {}
    for sink, event in pairs:
        if isinstance(sink, LoopSink):
            by_loop.setdefault(sink.loop, []).append((sink.queue, event))
        elif sink is not None:
            sink(event)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # closed, even since is_closed() said not
            loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[asyncio.Queue[TokenEvent], TokenEvent]]) -> None:
    for events, event in items:
        events.put_nowait(event)


T = TypeVar("T")
# A test and diagnostic knob, not a tuning one: every step that decodes takes at least this many
# milliseconds. Tests use it to hold the engine (a deadline the model cannot beat, a prefill that
# is still running, a drain with work in flight) on any machine, however fast; it is read by the
# engine core, so every process that runs one (server, CLI, cluster worker) honours it.
STEP_DELAY_ENV = "OUTPOST_DEBUG_STEP_DELAY_MS"


def step_delay_from_env() -> float:
    """Seconds from OUTPOST_DEBUG_STEP_DELAY_MS (0 when unset); a bad value is an error, not ignored."""
    raw = os.environ.get(STEP_DELAY_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        ms = float(raw)
    except ValueError:
        raise ValueError(f"{STEP_DELAY_ENV} must be a number of milliseconds (got {raw!r})") from None
    if not 0.0 <= ms <= 60_000.0:
        raise ValueError(f"{STEP_DELAY_ENV} must be between 0 and 60000 ms (got {raw})")
    return ms / 1000.0


class Runner(Protocol):
    """What the core needs from a model runner (the real one, or a fake in tests)."""

    def warmup(self) -> None: ...

    def execute(self, out: SchedulerOutput) -> RunnerOutput: ...

    def close(self) -> None: ...


class EngineCore:
    """Runs the step loop on its own thread until `stop()`."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: Runner,
        on_close: Callable[[], None] | None = None,
        step_delay: float | None = None,
        follow_up_wait: float = 0.0,
    ) -> None:
        self._start(lambda: (scheduler, runner), on_close, step_delay, follow_up_wait)

    @classmethod
    def built_on_thread(
        cls,
        build: Callable[[], tuple[Scheduler, Runner]],
        on_close: Callable[[], None] | None = None,
        step_delay: float | None = None,
        follow_up_wait: float = 0.0,
    ) -> EngineCore:
        """Runs `build` (load the model, make the runner) on the engine thread; raises what it raises.

        Why there: loading can run llama.cpp's OpenMP kernels (AMX repacks the weights), and a
        process whose OpenMP team was first made by another thread decodes up to 8x slower.
        """
        core = cls.__new__(cls)
        core._start(build, on_close, step_delay, follow_up_wait)
        return core

    def _start(
        self,
        build: Callable[[], tuple[Scheduler, Runner]],
        on_close: Callable[[], None] | None,
        step_delay: float | None,
        follow_up_wait: float,
    ) -> None:
        """step_delay: seconds each decoding step takes at least (None: OUTPOST_DEBUG_STEP_DELAY_MS).
        follow_up_wait: the most seconds to wait after a request ends for the next (follow_ups.py)."""
        self.step_delay = step_delay_from_env() if step_delay is None else step_delay
        self.follow_ups = FollowUps(follow_up_wait)
        self._on_close = on_close
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._sinks: dict[str, EventSink] = {}
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = queue.SimpleQueue()
        self.steps = 0
        self.decodes = 0  # steps that decoded (llama-server's n_decode)
        self.busy_slot_steps = 0  # sequences in those decodes, summed (llama-server's n_busy_slots)
        self._profile = profile_from_env()
        built: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(build, built), name="outpost-engine", daemon=True
        )
        self._thread.start()
        built.result()  # re-raises a failed load here, in the caller

    def submit(self, request: GenerateRequest, sink: EventSink) -> None:
        """Queue a request; raises QueueFull / RequestRejected at once, never later."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("engine is shutting down")
            self.scheduler.add_request(request)
            self._sinks[request.request_id] = sink
            self.follow_ups.submitted(time.monotonic())
        self._wake.set()

    def abort(self, request_id: str) -> None:
        """Stop a request at the next step (prefill or decode); its sink gets one ABORT event."""
        with self._lock:
            self.scheduler.abort(request_id)
        self._wake.set()

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """What the slots' KV holds now (a copy taken under the lock; for prefix-aware routing)."""
        with self._lock:
            return self.scheduler.cached_sequences()

    def with_scheduler(self, fn: Callable[[Scheduler], T]) -> T:
        """`fn(scheduler)` under the lock that guards it (slot actions read and change slots)."""
        with self._lock:
            return fn(self.scheduler)

    def run_on_engine_thread(self, job: Callable[[], T]) -> Future[T]:
        """Run `job` on the engine thread between two steps (e.g. an embedding batch).

        Why not on the caller's thread: llama.cpp's OpenMP kernels throttle their spin-waits
        when more than one thread drives them, and every decode in the process gets ~3x slower.
        """
        future: Future[T] = Future()
        self._jobs.put((job, future))  # type: ignore[arg-type]
        self._wake.set()
        return future

    def _run_jobs(self) -> bool:
        ran = False
        while not self._jobs.empty():
            job, future = self._jobs.get()
            ran = True
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
        return ran

    def _run(self, build: Callable[[], tuple[Scheduler, Runner]], built: Future[None]) -> None:
        try:
            self.scheduler, self._runner = build()
        except BaseException as exc:
            built.set_exception(exc)
            return
        built.set_result(None)
        if self._profile is not None:
            self._profile.bind()
        try:
            self._runner.warmup()  # on this thread: the only one that ever drives llama.cpp
            while not self._stopping:
                if not (self._run_jobs() | self._step()):
                    self._wake.wait(timeout=0.5)
                    self._wake.clear()
        except BaseException:  # a bug in the loop must not leave callers waiting forever
            _log.exception("engine loop crashed")
            self._fail_all("engine loop crashed; see the server log")
        finally:
            self._close_native()
            if self._profile is not None:
                self._profile.close()

    def _step(self) -> bool:
        """One schedule -> execute -> update round; False when there was nothing to do."""
        start = time.perf_counter()
        with self._lock:
            if not self.scheduler.has_work():
                return False
            out = self.scheduler.schedule(time.monotonic())
            if out.chunks:
                self.decodes += 1
                self.busy_slot_steps += len({c.seq_id for c in out.chunks})
        scheduled = time.perf_counter()
        result = self._execute(out)
        executed = time.perf_counter()
        if self.step_delay and out.chunks:
            time.sleep(self.step_delay)  # the debug pacing knob (see STEP_DELAY_ENV); outside the lock
        ended = False
        with self._lock:
            events = self.scheduler.update_from_output(out, result, time.monotonic())
            sinks = [(self._sinks.get(e.request_id), e) for e in events]
            for event in events:
                if event.finished:
                    self._sinks.pop(event.request_id, None)
                    ended = True
            if ended:  # before the events go out: a client's next request comes after this end
                self.follow_ups.ended(time.monotonic())
        updated = time.perf_counter()
        self.steps += 1
        # No yield to the woken consumers here: they take the GIL while the next llama_decode
        # runs (it releases the GIL). Handing it over first (time.sleep(0)) cost time on every step
        # and was no faster for 1 or 8 streams (docs/performance.md, "Engine").
        deliver(sinks)
        if self._profile is not None and out.chunks:
            marks = (start, scheduled, executed, updated, time.perf_counter())
            self._profile.record(out, result.decode_s, marks)
        if ended:
            self._await_follow_up()
        return True

    def _await_follow_up(self) -> None:
        """Just after a step that ended requests: wait, within the bound, for a closed loop's next
        request, unless a prompt is already there to read (follow_ups.py). Anything that arrives
        (a request, an abort, a job) ends the wait."""
        with self._lock:
            wait = self.follow_ups.wait_s()
            if (
                not wait
                or self.scheduler.prompts_pending
                or not self.scheduler.has_work()
                or not self._jobs.empty()
            ):
                return
            # Cleared under the lock: a submit adds its request under it, then wakes us.
            self._wake.clear()
        self._wake.wait(wait)

    def _execute(self, out: SchedulerOutput) -> RunnerOutput:
        if out.is_empty:
            return RunnerOutput()
        try:
            return self._runner.execute(out)
        except Exception as exc:  # fail this step's requests, keep serving the rest
            _log.exception("runner failed a step")
            return RunnerOutput(decode_status=-1000, error=f"engine error: {exc}")

    def _fail_all(self, message: str) -> None:
        with self._lock:
            sinks, self._sinks = self._sinks, {}
        for request_id, sink in sinks.items():
            sink(TokenEvent(request_id, finish_reason=FinishReason.ERROR, error=message))

    def _close_native(self) -> None:
        self._runner.close()
        if self._on_close is not None:
            self._on_close()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the current step, end every open request with ABORT, free native resources."""
        with self._lock:
            self._stopping = True
            pending = list(self._sinks)
        self._wake.set()
        self._thread.join(timeout)
        for request_id in pending:
            sink = self._sinks.pop(request_id, None)
            if sink is not None:
                sink(TokenEvent(request_id, finish_reason=FinishReason.ABORT, error="engine stopped"))

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


class EngineClient:
    """The caller's side: async streams for the server, a blocking iterator for the CLI."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core

    def open(self, request: GenerateRequest) -> LocalStream:
        """Submit at once (raises QueueFull / RequestRejected / RuntimeError here) and return its events.

        Must run on the event loop that will iterate the stream.
        """
        return LocalStream(self.core, request)

    def generate_sync(self, request: GenerateRequest) -> Iterator[TokenEvent]:
        """Blocking version for the CLI; closing the iterator early aborts the request."""
        events: queue.SimpleQueue[TokenEvent] = queue.SimpleQueue()
        self.core.submit(request, events.put)
        finished = False
        try:
            while not finished:
                event = events.get()
                finished = event.finished
                yield event
        finally:
            if not finished:
                self.core.abort(request.request_id)

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)


class LocalStream:
    """One request's events from the engine thread, as an `outpost.backend.EventStream`."""

    def __init__(self, core: EngineCore, request: GenerateRequest) -> None:
        self.request_id = request.request_id
        self._core = core
        self._finished = False
        self._events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        core.submit(request, LoopSink(asyncio.get_running_loop(), self._events))

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        try:
            while not self._finished:
                event = await self._events.get()
                self._finished = event.finished
                yield event
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Abort the request unless its final event was delivered; safe to call twice."""
        if not self._finished:
            self._finished = True
            self._core.abort(self.request_id)
