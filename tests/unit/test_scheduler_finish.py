"""How requests end: abort, deadline, EOG, stop strings, max_tokens, context end; text and timings."""

from __future__ import annotations

import pytest
from fake_runner import EOG, reference_tokens
from sched_harness import Harness, greedy

from outpost.messages import FinishReason, GenerateRequest, QueueFull
from outpost.scheduler import Scheduler, SchedulerConfig


def prompt(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def config(**kwargs: int) -> SchedulerConfig:
    values = {"n_slots": 2, "n_ctx": 512, "n_ctx_seq": 512, "step_token_budget": 16, **kwargs}
    return SchedulerConfig(**values)


def test_abort_during_prefill_keeps_only_evaluated_tokens() -> None:
    h = Harness(config(n_slots=1, step_token_budget=8))
    long_prompt = prompt(40)
    rid = h.add(long_prompt, max_tokens=5)
    h.step()
    h.step()  # 16 of 40 prompt tokens evaluated
    h.sched.abort(rid)
    events = h.step()
    assert [(e.request_id, e.finish_reason) for e in events] == [(rid, FinishReason.ABORT)]
    assert h.sched.slots_busy == 0
    assert h.runner.steps[-1].chunks == []  # nothing decoded for it after the abort
    assert h.sched.cached_tokens(0) == tuple(long_prompt[:16])
    timings = h.final(rid).timings
    assert timings is not None and timings.prompt_n == 16 and timings.predicted_n == 0
    later = h.add([*long_prompt[:20], 1], max_tokens=2)  # still served, reusing the 16
    h.run()
    assert h.final(later).finish_reason == FinishReason.LENGTH
    assert h.final(later).timings.cache_n == 16  # type: ignore[union-attr]


def test_abort_during_decode() -> None:
    h = Harness(config())
    rid = h.add(prompt(4), max_tokens=50)
    other = h.add(prompt(4, base=300), max_tokens=6)
    for _ in range(3):
        h.step()
    h.sched.abort(rid)
    h.sched.abort("no-such-request")  # ignored
    h.run()
    assert h.final(rid).finish_reason == FinishReason.ABORT
    assert len(h.token_ids(rid)) == 3
    assert h.token_ids(other) == reference_tokens(prompt(4, base=300), 6)


def test_abort_while_waiting_and_twice() -> None:
    h = Harness(config(n_slots=1))
    h.add(prompt(4), max_tokens=3)
    waiting = h.add(prompt(4, base=300), max_tokens=3)
    h.sched.abort(waiting)
    h.sched.abort(waiting)
    h.run()
    assert [e.finish_reason for e in h.events[waiting]] == [FinishReason.ABORT]


def test_deadline_while_waiting() -> None:
    h = Harness(config(n_slots=1))
    first = h.add(prompt(4), max_tokens=10)
    late = h.add(prompt(4, base=300), max_tokens=10, deadline=h.now + 0.035)
    h.run()
    assert h.final(first).finish_reason == FinishReason.LENGTH
    final = h.final(late)
    assert final.finish_reason == FinishReason.TIMEOUT and final.token_ids == []
    assert final.timings is not None and final.timings.queue_ms > 30


def test_deadline_while_running() -> None:
    h = Harness(config())
    rid = h.add(prompt(4), max_tokens=100, deadline=h.now + 0.055)
    h.run()
    final = h.final(rid)
    assert final.finish_reason == FinishReason.TIMEOUT
    assert 4 <= len(h.token_ids(rid)) <= 6
    assert h.sched.slots_busy == 0


@pytest.mark.parametrize("first_ends_by", ["length", "abort"])
def test_a_deadline_fires_after_another_deadline_request_ended(first_ends_by: str) -> None:
    """The scheduler only scans for deadlines while a live request has one: a request with a
    deadline that ends first (done or aborted) must not keep a live one's deadline from firing."""
    h = Harness(config())
    first = h.add(prompt(4), max_tokens=2 if first_ends_by == "length" else 50, deadline=h.now + 10.0)
    late = h.add(prompt(4, base=300), max_tokens=100, deadline=h.now + 0.055)
    h.step()
    if first_ends_by == "abort":
        h.sched.abort(first)
    h.run()
    expected = FinishReason.LENGTH if first_ends_by == "length" else FinishReason.ABORT
    assert h.final(first).finish_reason == expected
    assert h.final(late).finish_reason == FinishReason.TIMEOUT
    again = h.add(prompt(4, base=500), max_tokens=100, deadline=h.now + 0.055)
    h.run()
    assert h.final(again).finish_reason == FinishReason.TIMEOUT


def test_eog_finishes_with_stop_and_is_not_in_token_ids() -> None:
    h = Harness(config())
    p = prompt(3)
    h.runner.script(p, [1, 2, EOG])
    rid = h.add(p, max_tokens=10)
    h.run()
    final = h.final(rid)
    assert final.finish_reason == FinishReason.STOP
    assert h.token_ids(rid) == [1, 2] and h.text(rid) == "ab"
    assert final.timings is not None and final.timings.predicted_n == 3  # EOG counted as generated


def test_ignore_eos_keeps_going() -> None:
    h = Harness(config())
    p = prompt(3)
    h.runner.script(p, [1, EOG, 2])
    rid = h.add(p, max_tokens=4, sampling=greedy(ignore_eos=True))
    h.run()
    assert h.final(rid).finish_reason == FinishReason.LENGTH
    assert h.token_ids(rid)[:3] == [1, EOG, 2]


def test_stop_string_split_over_tokens_never_leaks() -> None:
    h = Harness(config())
    p = prompt(3)
    # "ab" "S" "T" "OP" -> "abSTOP": stop "STOP" spans three tokens.
    h.runner.script(p, [1, 2, 40, 41, 45, 3, 3])
    rid = h.add(p, max_tokens=20, stop=("STOP",))
    h.run()
    assert h.final(rid).finish_reason == FinishReason.STOP
    assert h.text(rid) == "ab"
    assert all("S" not in e.text for e in h.events[rid])
    assert h.token_ids(rid) == [1, 2, 40, 41, 45]
    assert [e.text for e in h.events[rid]] == ["a", "b", "", "", ""]


def test_partial_stop_match_is_released_when_it_fails() -> None:
    h = Harness(config())
    p = prompt(3)
    h.runner.script(p, [40, 41, 1, 2])
    rid = h.add(p, max_tokens=4, stop=("STOP",))
    h.run()
    assert [e.text for e in h.events[rid]] == ["", "", "STa", "b"]
    assert h.final(rid).finish_reason == FinishReason.LENGTH


def test_held_back_text_is_flushed_on_length() -> None:
    h = Harness(config())
    p = prompt(3)
    h.runner.script(p, [1, 44])
    rid = h.add(p, max_tokens=2, stop=("STOP",))
    h.run()
    assert h.text(rid) == "aST"


def test_utf8_split_across_tokens() -> None:
    h = Harness(config())
    p = prompt(3)
    h.runner.script(p, [30, 31, 32, 33, 34, 35, 36, 1])
    rid = h.add(p, max_tokens=8)
    h.run()
    texts = [e.text for e in h.events[rid]]
    assert texts == ["", "é", "", "€", "", "😀", "\ufffd", "a"]
    assert h.text(rid) == "é€😀\ufffda"


def test_incomplete_utf8_at_the_end_is_flushed_as_replacement() -> None:
    h = Harness(config())
    p = prompt(3)
    h.runner.script(p, [1, 34])
    rid = h.add(p, max_tokens=2)
    h.run()
    assert h.text(rid) == "a\ufffd"


def test_max_tokens_gives_exactly_that_many() -> None:
    h = Harness(config())
    rids = [h.add(prompt(5, base=100 * (i + 1)), max_tokens=n) for i, n in enumerate((1, 7))]
    h.run()
    for rid, n in zip(rids, (1, 7), strict=True):
        final = h.final(rid)
        assert final.finish_reason == FinishReason.LENGTH
        assert len(h.token_ids(rid)) == n
        assert final.timings is not None and final.timings.predicted_n == n


def test_context_end_finishes_with_length() -> None:
    h = Harness(config(n_ctx=64, n_ctx_seq=16))
    rid = h.add(prompt(10), max_tokens=100)
    h.run()
    assert h.final(rid).finish_reason == FinishReason.LENGTH
    assert len(h.token_ids(rid)) == 6  # prompt + output = n_ctx_seq
    assert max(c.start_pos + len(c.tokens) for s in h.runner.steps for c in s.chunks) <= 16


def test_timings() -> None:
    h = Harness(config(n_slots=1, step_token_budget=8), dt=0.5)
    arrival = h.now
    first = h.add(prompt(4), max_tokens=2)  # occupies the only slot for two steps
    rid = h.add(prompt(20, base=300), max_tokens=3)
    h.run()
    assert h.final(first).finish_reason == FinishReason.LENGTH
    t = h.final(rid).timings
    assert t is not None
    # Admitted at the third schedule (now = arrival + 1.0): two steps of the first request.
    assert t.queue_ms == 1000.0
    # Prefill of 20 tokens at 8 per step: 3 steps (scheduled at +1.0, first token at +2.5).
    assert (t.prompt_n, t.cache_n) == (20, 0)
    assert t.prompt_ms == 1500.0
    assert (t.predicted_n, t.predicted_ms) == (3, 1000.0)
    assert h.final(first).timings.queue_ms == 0.0  # type: ignore[union-attr]
    assert arrival == 100.0


def test_abort_between_schedule_and_update_takes_effect_next_step() -> None:
    h = Harness(config())
    rid = h.add(prompt(4), max_tokens=10)
    h.step()
    out = h.sched.schedule(h.now)
    res = h.runner.execute(out)
    h.sched.abort(rid)  # the step is already decided: its token still arrives
    events = h.sched.update_from_output(out, res, h.now)
    assert [(e.request_id, e.finished, len(e.token_ids)) for e in events] == [(rid, False, 1)]
    h.events[rid] += events
    h.run()
    assert h.final(rid).finish_reason == FinishReason.ABORT
    assert len(h.token_ids(rid)) == 2


def test_queue_bound_zero_accepts_only_free_slots() -> None:
    sched = Scheduler(SchedulerConfig(n_slots=2, max_queue=0))
    sched.add_request(GenerateRequest([1], 1))
    sched.add_request(GenerateRequest([1], 1))
    with pytest.raises(QueueFull, match="max_queue=0"):
        sched.add_request(GenerateRequest([1], 1))
