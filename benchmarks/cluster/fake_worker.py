"""A cluster worker with no model, for benchmarks/cluster/'s scenario (f): the gateway alone.

The real `outpost.cluster.worker.service.Worker` (intake, replies, acks, heartbeats: everything a worker
does on the broker) over `FakeEngine`, an `InferenceBackend` which answers every request with
`max_tokens` tokens at once (`--token-interval 0`) or the first at once and then one every
`--token-interval` seconds, from one thread and a timer heap, so a worker can hold thousands of
slow streams without a thread each. Its token ids are taken from the prompt (valid for the
gateway's vocabulary), its text is one short word per token.

Not run by hand, except to try it:
    python -m benchmarks.cluster.fake_worker --broker amqp://outpost@127.0.0.1:5672/ \\
        --broker-password-file PASSWORD --model-id tiny-q4_0 --slots 256 --token-interval 0
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from outpost.backend import BackendStats
from outpost.cluster.broker.connection import broker_url
from outpost.cluster.worker.main import serve_worker
from outpost.messages import FinishReason, GenerateRequest, Timings, TokenEvent

Sink = Callable[[TokenEvent], None]


@dataclass
class _Work:
    request: GenerateRequest
    sink: Sink
    budget: int  # tokens still to send (max_tokens less what a resumed request had sent)
    sent: int = 0
    started: float = 0.0


class _Codec:
    chat_template_source = None  # the worker's heartbeat hashes it; nothing else is read


class _Stream:
    """One request's events from the timer thread, as an `EventStream`."""

    def __init__(self, engine: FakeEngine, request_id: str) -> None:
        self.request_id = request_id
        self._engine = engine
        self._events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._done = False
        loop = asyncio.get_running_loop()
        self.sink: Sink = lambda event: loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while not self._done:
            event = await self._events.get()
            self._done = event.finished
            yield event

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            self._engine.cancel(self.request_id)


class FakeEngine:
    """An InferenceBackend that emits tokens on a timer: `slots` requests at once, no KV, no embeddings."""

    codec = _Codec()
    n_ctx_seq = 1 << 20

    def __init__(self, slots: int, interval: float) -> None:
        self.slots_total = slots
        self.kv_cells = 4096 * slots
        self.interval = interval
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, _Work]] = []
        self._order = itertools.count()
        self._aborted: set[str] = set()
        threading.Thread(target=self._loop, name="fake-engine", daemon=True).start()

    async def submit(self, request: GenerateRequest) -> _Stream:
        events = _Stream(self, request.request_id)
        now = time.monotonic()
        work = _Work(request, events.sink, max(0, request.max_tokens - request.n_resumed), started=now)
        self._push(now, work)  # the first token at once, the next ones every interval
        return events

    async def abort(self, request_id: str) -> None:
        self.cancel(request_id)

    def cancel(self, request_id: str) -> None:
        with self._cv:
            self._aborted.add(request_id)
            self._cv.notify()

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        return [[float(len(t)), 1.0] for t in texts], sum(len(t.split()) for t in texts)

    def stats(self) -> BackendStats:
        return BackendStats(slots_total=self.slots_total, kv_cells_total=self.kv_cells)

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return []

    def describe(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass

    def _push(self, due: float, stream: _Work) -> None:
        with self._cv:
            heapq.heappush(self._heap, (due, next(self._order), stream))
            self._cv.notify()

    def _next(self) -> tuple[float, _Work]:
        with self._cv:
            while True:
                now = time.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    due, _, stream = heapq.heappop(self._heap)
                    return due, stream
                self._cv.wait(self._heap[0][0] - now if self._heap else None)

    def _loop(self) -> None:
        while True:
            due, stream = self._next()
            if self._step(stream):
                self._push(due + self.interval, stream)

    def _step(self, s: _Work) -> bool:
        """Emit the next token (all of them when not paced); True while the stream goes on."""
        rid = s.request.request_id
        with self._cv:
            aborted = rid in self._aborted
            self._aborted.discard(rid)
        if aborted:
            s.sink(TokenEvent(rid, finish_reason=FinishReason.ABORT))
            return False
        prompt = s.request.prompt_tokens
        while s.sent < s.budget:
            token = prompt[(s.sent + s.request.n_resumed) % len(prompt)] if prompt else 0
            s.sink(TokenEvent(rid, token_ids=[token], text=" ok"))
            s.sent += 1
            if self.interval > 0:
                break
        if s.sent < s.budget:
            return True
        ms = (time.monotonic() - s.started) * 1000.0
        timings = Timings(len(prompt), 0.1, s.sent, ms, 0, 0.0)
        s.sink(TokenEvent(rid, finish_reason=FinishReason.LENGTH, timings=timings))
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--broker", required=True)
    p.add_argument("--broker-password-file")
    p.add_argument("--model-id", required=True, help="the gateway's model id (its -m file's stem)")
    p.add_argument("--slots", type=int, default=256)
    p.add_argument("--token-interval", type=float, default=0.0, help="seconds between tokens (0: at once)")
    p.add_argument("--worker-id")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    engine = FakeEngine(args.slots, args.token_interval)
    url = broker_url(args.broker, args.broker_password_file)
    raise SystemExit(asyncio.run(serve_worker(url, args.model_id, engine, args.worker_id)))


if __name__ == "__main__":
    main()
