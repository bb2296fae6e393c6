"""The follow-up wait (outpost/serving/follow_ups.py): the policy with made-up times, and the engine
core with a fake runner and a closed-loop client on its own thread. The core's bound is far longer
than any machine takes to hand a request over, so what a step holds never depends on speed."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

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
    """Records the sequences each step reads prompts for and decodes. Held by a count of steps
    (`hold_after`, then `release`), so the engine runs a known number of steps while a client
    acts, however fast or slow the machine."""

    def __init__(self) -> None:
        super().__init__()
        self.record: list[tuple[set[int], set[int]]] = []  # (prompt seq ids, decoding seq ids)
        self.stepped = threading.Condition()
        self.allowed: int | None = None  # steps the engine may still run; None: any number

    def hold_after(self, steps: int) -> None:
        with self.stepped:
            self.allowed = steps

    def release(self) -> None:
        with self.stepped:
            self.allowed = None
            self.stepped.notify_all()

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        with self.stepped:
            free = self.stepped.wait_for(lambda: self.allowed is None or self.allowed > 0, 30)
            assert free, "a test held the engine for too long"
            if self.allowed is not None:
                self.allowed -= 1
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


class CountingFollowUps(FollowUps):
    """The real policy, recording what the core tells it, in order."""

    def __init__(self, max_wait_s: float) -> None:
        super().__init__(max_wait_s)
        self.calls: list[str] = []

    def ended(self, now: float) -> None:
        self.calls.append("end")
        super().ended(now)

    def submitted(self, now: float) -> None:
        self.calls.append("submit")
        super().submitted(now)


def _run_loop(
    wait_s: float, hold_client: bool, follow_ups: FollowUps | None = None
) -> tuple[RecordingRunner, list[int]]:
    """A stream that keeps decoding (seq 0) beside a closed-loop client (seq 1) that sends its next
    2-token request when the last one ends, from its own thread, MIN_ENDS + 4 times. After each end
    the engine may run 2 steps until the client has sent again. With hold_client, the client sends
    only after the engine has run a step past the end. Returns the runner and, per end after the
    first MIN_ENDS + 1, the index of the step that came next."""
    runner = RecordingRunner()
    config = SchedulerConfig(n_slots=2, n_ctx=4096, n_ctx_seq=2048, step_token_budget=64)
    core = EngineCore(Scheduler(config), runner, follow_up_wait=wait_s)
    if follow_ups is not None:
        core.follow_ups = follow_ups
    ended: queue.SimpleQueue[int] = queue.SimpleQueue()

    def send(prompt: list[int], sink: Callable[[TokenEvent], None]) -> None:
        core.submit(GenerateRequest(prompt, max_tokens=2), sink)
        runner.release()

    def sink(event: TokenEvent) -> None:
        if event.finished:  # on the engine thread, right after the ending step
            runner.hold_after(2)
            ended.put(len(runner.record))

    try:
        runner.hold_after(2)
        core.submit(GenerateRequest([9, 8, 7], max_tokens=1000), lambda e: None)
        runner.wait_for_steps(2)  # the stream decodes: it stays in slot 0
        nexts = []
        for i in range(MIN_ENDS + 4):
            send([10 + i, 40 + i, 70 + i], sink)
            after = ended.get(timeout=30)
            if hold_client:
                runner.wait_for_steps(after + 1)
            if i > MIN_ENDS:
                nexts.append(after)
        send([90, 91, 92], lambda e: None)
        runner.wait_for_steps(nexts[-1] + 2)
        return runner, nexts
    finally:
        runner.release()
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


def test_the_core_tells_the_policy_each_end_before_its_follow_up() -> None:
    """The end is recorded before the ended request's events go out, so the client's next request
    can only come after it, and counts as its follow-up."""
    spy = CountingFollowUps(60.0)
    _run_loop(wait_s=60.0, hold_client=False, follow_ups=spy)
    ends = MIN_ENDS + 4
    loop = ["submit"] * 2 + ["end", "submit"] * ends
    assert spy.calls[: len(loop)] == loop, spy.calls
    last = spy.calls[len(loop) :]  # the last request may end before the core stops: nothing follows it
    assert last in ([], ["end"]), spy.calls
    assert spy.followed == min(ends, WINDOW) - len(last)
