"""LocalEngines with no model, for the worker over a real broker.

`CountingEngine`: token i of a request is its position, so resumes are checkable; its embeddings
are a function of the texts, and a test may hold them. `ScriptedEngine`: the real EngineCore and
Scheduler (so the real TextStream, stop strings and resume priming) over a runner whose output i
is a piece of text the test chose, and which a test may hold before a given output.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from outpost.core import EngineCore
from outpost.messages import FinishReason, GenerateRequest, Timings, TokenEvent
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import RunnerOutput, SampledToken, SchedulerOutput

MAX_EMBED_CHARS = 50  # a longer text is "longer than the embedding context"


class CountingEngine:
    """Emits one token per `step_s` on its own thread: the token id is its position in the sequence."""

    def __init__(self, slots: int = 2, step_s: float = 0.01) -> None:
        self.slots_total = slots
        self.kv_cells = 4096
        self.step_s = step_s
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self.started: list[str] = []
        self.busy = threading.Semaphore(0)
        self.embeds_begun: list[list[str]] = []
        self.embed_gate: asyncio.Event | None = None  # when given, embeddings wait until it is set
        self.prompts: list[list[int]] = []  # every prompt it ran: its "KV cache" (the last `slots`)
        self.running = 0
        self.max_running = 0  # the most requests it ever ran at once

    def submit(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        with self._lock:
            self.started.append(request.request_id)
            self.prompts.append(list(request.prompt_tokens))
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        threading.Thread(target=self._run, args=(request, sink), daemon=True).start()

    def cached_sequences(self) -> list[tuple[int, ...]]:
        with self._lock:
            return [tuple(p) for p in self.prompts[-self.slots_total :]]

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """[length, index, 1] per text and a token per word; ValueError for a text too long."""
        self.embeds_begun.append(list(texts))
        if self.embed_gate is not None:
            await self.embed_gate.wait()
        for i, text in enumerate(texts):
            if len(text) > MAX_EMBED_CHARS:
                raise ValueError(f"input {i} has {len(text)} characters; the fake holds {MAX_EMBED_CHARS}")
        return [[float(len(t)), float(i), 1.0] for i, t in enumerate(texts)], sum(
            len(t.split()) for t in texts
        )

    def _run(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        try:
            with contextlib.suppress(RuntimeError):  # the test's loop closed under a "killed" worker
                self._emit(request, sink)
        finally:
            with self._lock:
                self.running -= 1

    def _emit(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        rid = request.request_id
        n = len(request.prompt_tokens)
        budget = request.max_tokens - request.n_resumed  # a resumed request's sent tokens count
        stop = threading.Event()
        for i in range(budget):
            if stop.wait(self.step_s) or rid in self._aborted:
                sink(TokenEvent(rid, finish_reason=FinishReason.ABORT))
                return
            sink(TokenEvent(rid, token_ids=[n + i], text=f"<{n + i}>"))
        sink(TokenEvent(rid, finish_reason=FinishReason.LENGTH, timings=Timings(n, 1.0, budget, 1.0)))


EOG = 0
FIRST_OUTPUT = 1000  # output i of a request is token FIRST_OUTPUT + i


class ScriptedRunner:
    """Output i of every request (whose prompt has `prompt_len` tokens) renders as `outputs[i]`; EOG after.

    With `hold_at`, the step that would sample output `hold_at` waits for `release` (the engine is
    held, the outputs before it sent): a worker can be killed at that exact point.
    """

    def __init__(self, prompt_len: int, outputs: list[bytes], hold_at: int | None = None) -> None:
        self.prompt_len = prompt_len
        self.outputs = outputs
        self.hold_at = hold_at
        self.holding = threading.Event()
        self.release = threading.Event()

    def piece(self, token: int) -> bytes:
        i = token - FIRST_OUTPUT
        return self.outputs[i] if 0 <= i < len(self.outputs) else b""

    def warmup(self) -> None:
        pass

    def close(self) -> None:
        pass

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        sampled = {}
        for chunk in out.chunks:
            if not chunk.sample:
                continue
            i = chunk.start_pos + len(chunk.tokens) - self.prompt_len  # the output this samples
            if self.hold_at is not None and i >= self.hold_at:
                self.holding.set()
                assert self.release.wait(60), "a test held the engine for too long"
            token = FIRST_OUTPUT + i if i < len(self.outputs) else EOG
            sampled[chunk.seq_id] = SampledToken(token, self.piece(token), token == EOG)
        return RunnerOutput(sampled=sampled)


class ScriptedEngine:
    """A LocalEngine on the real EngineCore and Scheduler over a ScriptedRunner."""

    def __init__(self, runner: ScriptedRunner, slots: int = 1) -> None:
        config = SchedulerConfig(n_slots=slots, n_ctx=512, n_ctx_seq=256, max_queue=4, step_token_budget=64)
        self.runner = runner
        self.slots_total = slots
        self.kv_cells = config.n_ctx
        self.core = EngineCore(Scheduler(config, runner.piece), runner, step_delay=0.0)

    def submit(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        self.core.submit(request, sink)

    def abort(self, request_id: str) -> None:
        self.core.abort(request_id)

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return self.core.cached_sequences()

    def close(self) -> None:
        self.runner.release.set()
        self.core.stop()
