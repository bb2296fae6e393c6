"""OUTPOST_DEBUG_STEP_DELAY_MS: the engine pauses after each step that did work (tests use it to
keep a stream running while they act on it)."""

from __future__ import annotations

import time

import pytest
from fake_runner import FakeRunner

from outpost.messages import GenerateRequest
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.serving.engine_core import STEP_DELAY_ENV, EngineClient, EngineCore


class Runner(FakeRunner):
    def warmup(self) -> None:
        pass

    def close(self) -> None:
        pass


def _run(steps: int) -> tuple[float, int]:
    config = SchedulerConfig(n_slots=1, n_ctx=256, n_ctx_seq=256, max_queue=1, step_token_budget=64)
    core = EngineCore(Scheduler(config), Runner())
    try:
        start = time.monotonic()
        events = list(EngineClient(core).generate_sync(GenerateRequest([3, 4], max_tokens=steps)))
        return time.monotonic() - start, sum(len(e.token_ids) for e in events)
    finally:
        core.stop()


def test_each_step_waits_at_least_the_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(STEP_DELAY_ENV, "40")
    seconds, tokens = _run(10)
    assert tokens == 10
    # nine pauses come before the last token; a floor only: a slow machine just takes longer
    assert seconds >= 9 * 0.040 * 0.95, seconds
