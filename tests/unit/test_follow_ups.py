"""The follow-up wait (outpost/serving/follow_ups.py): the policy with made-up times, and the engine
core with a fake runner and a closed-loop client on its own thread. The core's bound is far longer
than any machine takes to hand a request over, so what a step holds never depends on speed."""

from __future__ import annotations

import queue
import threading
import time

import pytest
from fake_runner import FakeRunner

from outpost.messages import GenerateRequest, TokenEvent
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import RunnerOutput, SchedulerOutput
from outpost.serving.engine_core import EngineCore
from outpost.serving.follow_ups import FORGET_AFTER_S, MIN_ENDS, WINDOW, FollowUps


def _closed_loop(policy: FollowUps, ends: int, gap: float, t: float = 0.0) -> float:
    for _ in range(ends):
        policy.ended(t)
        policy.submitted(t + gap)
        t += 1.0
    return t


def _wait_at(policy: FollowUps, t: float) -> float:
    """What the core would wait after an end at `t`."""
    policy.ended(t)
    return policy.wait_s()


def test_no_wait_until_enough_ends_were_seen() -> None:
    policy = FollowUps(0.02)
    t = _closed_loop(policy, MIN_ENDS - 1, gap=0.005)
    assert _wait_at(policy, t) == 0.0, "the end just recorded is not judged by itself"
    policy.submitted(t + 0.005)
    policy.ended(t + 1)
    assert policy.wait_s() == 0.02


def test_a_request_after_the_bound_or_a_second_one_is_no_follow_up() -> None:
    late = FollowUps(0.02)
    t = _closed_loop(late, WINDOW, gap=0.05)  # an open stream of arrivals, none within the bound
    assert _wait_at(late, t) == 0.0
    crowd = FollowUps(0.02)
    t = 0.0
    for _ in range(WINDOW):  # one end followed by many requests counts once, as one end
        crowd.ended(t)
        for k in range(5):
            crowd.submitted(t + 0.001 * k)
        crowd.ended(t + 0.5)  # ...and the next end has none
        t += 1.0
    assert _wait_at(crowd, t) == 0.0


def test_ends_a_step_apart_each_count_the_request_that_follows_them() -> None:
    """Two streams of a loop end in consecutive steps, 12 ms apart; both clients' requests come after
    the second end: each end is followed, the first by the first request."""
    policy = FollowUps(0.02)
    t = 0.0
    for _ in range(MIN_ENDS):
        policy.ended(t)
        policy.ended(t + 0.012)
        policy.submitted(t + 0.015)
        policy.submitted(t + 0.017)
        t += 1.0
    assert policy.followed == 2 * MIN_ENDS
    assert _wait_at(policy, t) == 0.02


def test_the_wait_stops_once_ends_are_no_longer_followed() -> None:
    policy = FollowUps(0.02)
    t = _closed_loop(policy, WINDOW, gap=0.004)
    assert _wait_at(policy, t) == 0.02
    t = _closed_loop(policy, WINDOW // 2, gap=1.0, t=t + 1)  # the loop's clients went away
    assert _wait_at(policy, t) == 0.0


def test_ends_before_a_pause_are_forgotten() -> None:
    """A loop that stopped left its last ends unfollowed; after a pause, the next loop's ends are
    judged without them."""
    policy = FollowUps(0.02)
    t = _closed_loop(policy, WINDOW, gap=1.0)  # none followed
    t += FORGET_AFTER_S + 1
    t = _closed_loop(policy, MIN_ENDS, gap=0.005, t=t)
    assert _wait_at(policy, t) == 0.02


def test_zero_is_off_and_a_negative_bound_is_refused() -> None:
    off = FollowUps(0.0)
    t = _closed_loop(off, WINDOW, gap=0.0)
    assert _wait_at(off, t) == 0.0 and off.describe() == "follow-up wait off"
    with pytest.raises(ValueError, match="follow-up wait"):
        FollowUps(-1.0)


class RecordingRunner(FakeRunner):
    """Records the sequences each step reads prompts for and decodes; `stepped` counts steps."""

    def __init__(self) -> None:
        super().__init__()
        self.record: list[tuple[set[int], set[int]]] = []  # (prompt seq ids, decoding seq ids)
        self.stepped = threading.Condition()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        time.sleep(0.001)  # a step takes a moment, as a decode does: fewer steps while a client acts
        result = super().execute(out)
        prompts = {c.seq_id for c in out.chunks if len(c.tokens) > 1}
        decoding = {c.seq_id for c in out.chunks if len(c.tokens) == 1}
        with self.stepped:
            self.record.append((prompts, decoding))
            self.stepped.notify_all()
        return result

    def warmup(self) -> None:
        pass

    def close(self) -> None:
        pass

    def wait_for_steps(self, n: int) -> None:
        with self.stepped:
            assert self.stepped.wait_for(lambda: len(self.record) >= n, 30), "the engine stopped stepping"


def _run_loop(wait_s: float, hold_client: bool) -> tuple[RecordingRunner, list[int]]:
    """A stream that keeps decoding (seq 0) beside a closed-loop client (seq 1) that sends its next
    2-token request when the last one ends, from its own thread, MIN_ENDS + 3 times. With
    hold_client, it sends only after the engine has run a step past the end. Returns the runner
    and, per end after the first MIN_ENDS + 1, the index of the step that came next."""
    runner = RecordingRunner()
    config = SchedulerConfig(n_slots=2, n_ctx=1 << 16, n_ctx_seq=1 << 15, step_token_budget=64)
    core = EngineCore(Scheduler(config), runner, follow_up_wait=wait_s)
    ended: queue.SimpleQueue[int] = queue.SimpleQueue()
    try:
        core.submit(GenerateRequest([9, 8, 7], max_tokens=30000), lambda e: None)
        runner.wait_for_steps(2)  # the stream decodes: it stays in slot 0

        def sink(event: TokenEvent) -> None:
            if event.finished:
                ended.put(len(runner.record))  # the engine thread, right after the ending step

        nexts = []
        for i in range(MIN_ENDS + 4):
            core.submit(GenerateRequest([10 + i, 40 + i, 70 + i], max_tokens=2), sink)
            after = ended.get(timeout=30)
            if hold_client:
                runner.wait_for_steps(after + 1)
            if i > MIN_ENDS:
                nexts.append(after)
        core.submit(GenerateRequest([90, 91, 92], max_tokens=2), lambda e: None)
        runner.wait_for_steps(nexts[-1] + 2)
        return runner, nexts
    finally:
        core.stop()


def test_after_ends_that_were_followed_the_core_waits_and_reads_the_next_prompt_next() -> None:
    runner, nexts = _run_loop(wait_s=60.0, hold_client=False)
    for index in nexts:
        prompts, decoding = runner.record[index]
        assert prompts == {1}, f"step {index} should read the loop's next prompt: {runner.record}"
        assert decoding == {0}, "the stream decodes beside it"


def test_without_the_wait_the_stream_steps_on_before_the_next_request() -> None:
    runner, nexts = _run_loop(wait_s=0.0, hold_client=True)
    for index in nexts:
        assert runner.record[index] == (set(), {0}), f"step {index}: {runner.record}"


def test_the_core_counts_no_follow_up_for_requests_later_than_the_bound() -> None:
    """Each request comes at least 0.1 s after the last one ended (a sleep: never sooner, on any
    machine), past the 20 ms bound: the core must count none of them, and so never wait."""
    runner = RecordingRunner()
    config = SchedulerConfig(n_slots=2, n_ctx=1 << 16, n_ctx_seq=1 << 15, step_token_budget=64)
    core = EngineCore(Scheduler(config), runner, follow_up_wait=0.02)
    try:
        core.submit(GenerateRequest([9, 8, 7], max_tokens=30000), lambda e: None)
        done: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(MIN_ENDS + 2):
            core.submit(
                GenerateRequest([10 + i, 40 + i, 70 + i], max_tokens=2), lambda e: e.finished and done.put(1)
            )
            done.get(timeout=30)
            time.sleep(0.1)
        assert core.follow_ups.wait_s() == 0.0
        assert core.follow_ups.followed == 0
    finally:
        core.stop()
