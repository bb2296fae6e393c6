"""A LocalEngine with no model: token i of a request is its position, so resumes are checkable."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from outpost.messages import FinishReason, GenerateRequest, Timings, TokenEvent


class CountingEngine:
    """Emits one token per `step_s` on its own thread: the token id is its position in the sequence."""

    def __init__(self, slots: int = 2, step_s: float = 0.01) -> None:
        self.slots_total = slots
        self.step_s = step_s
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self.started: list[str] = []
        self.busy = threading.Semaphore(0)

    def submit(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        with self._lock:
            self.started.append(request.request_id)
        threading.Thread(target=self._run, args=(request, sink), daemon=True).start()

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborted.add(request_id)

    def _run(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the test's loop closed under a "killed" worker
            self._emit(request, sink)

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
