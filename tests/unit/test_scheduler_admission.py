"""Admission, slots, the token budget, chunked prefill, prefix reuse, queue bounds, rejections."""

from __future__ import annotations

import pytest
from fake_runner import reference_tokens, text_of
from sched_harness import Harness, greedy

from outpost.messages import FinishReason, GenerateRequest, QueueFull, RequestRejected
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import SamplerSetup, SeqCopy, SeqRemove
from outpost.scheduler.prefill import SHORT_PROMPT_CHUNKS
from outpost.scheduler.slots import common_prefix_len


def prompt(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def test_fcfs_admission_never_exceeds_slots_and_is_fair() -> None:
    h = Harness(SchedulerConfig(n_slots=3, n_ctx=512, n_ctx_seq=512, step_token_budget=64))
    rids = [h.add(prompt(5, base=100 + 10 * i), max_tokens=4) for i in range(10)]
    busy = []
    while h.sched.has_work():
        h.step()
        busy.append(h.sched.slots_busy)
    assert max(busy) == 3
    firsts = [h.first_event_step[r] for r in rids]
    assert firsts == sorted(firsts), "a later request was served before an earlier one"
    for i, rid in enumerate(rids):
        assert h.final(rid).finish_reason == FinishReason.LENGTH
        assert h.token_ids(rid) == reference_tokens(prompt(5, base=100 + 10 * i), 4)


def test_decode_tokens_first_then_prompt_chunks_within_budget() -> None:
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=512, step_token_budget=16))
    a = h.add(prompt(4), max_tokens=30)
    h.step()  # a's prompt, first token
    long_prompt = prompt(40, base=500)
    b = h.add(long_prompt, max_tokens=3)
    for _ in range(4):
        h.step()
    chunk_steps = [s.chunks for s in h.runner.steps[1:4]]
    for chunks in chunk_steps:
        assert chunks[0].seq_id == 0 and len(chunks[0].tokens) == 1 and chunks[0].sample
        assert sum(len(c.tokens) for c in chunks) <= 16
    b_chunks = [c for chunks in chunk_steps for c in chunks if c.seq_id == 1]
    assert [len(c.tokens) for c in b_chunks] == [15, 15, 10]
    assert [c.sample for c in b_chunks] == [False, False, True]
    assert [c.start_pos for c in b_chunks] == [0, 15, 30]
    assert h.events[b] and h.events[b][0].token_ids == reference_tokens(long_prompt, 1)
    h.run()
    assert len(h.token_ids(a)) == 30 and len(h.token_ids(b)) == 3


def test_prompt_chunks_go_in_admission_order() -> None:
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=512, step_token_budget=8))
    h.add(prompt(12), max_tokens=1)
    h.add(prompt(12, base=300), max_tokens=1)
    h.step()
    assert [(c.seq_id, len(c.tokens)) for c in h.runner.steps[0].chunks] == [(0, 8)]
    h.step()
    assert [(c.seq_id, len(c.tokens)) for c in h.runner.steps[1].chunks] == [(0, 4), (1, 4)]
    h.run()


def test_prefix_reuse_in_the_same_slot() -> None:
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=512, n_ctx_seq=512))
    shared = prompt(20)
    first = h.add([*shared, 7, 8], max_tokens=3)
    h.run()
    before = h.runner.evaluated
    second = h.add([*shared, 9, 9, 9], max_tokens=3)
    h.run()
    timings = h.final(second).timings
    assert timings is not None and timings.cache_n == 20 and timings.prompt_n == 3
    assert h.runner.evaluated - before == 3 + 2  # the new prompt tail, then two decode steps
    assert SeqRemove(0, 20, -1) in h.runner.steps[-4].memory_ops
    assert h.token_ids(second) == reference_tokens([*shared, 9, 9, 9], 3)
    assert h.final(first).timings.cache_n == 0  # type: ignore[union-attr]


def test_identical_prompt_reuses_all_but_the_last_token() -> None:
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=512, n_ctx_seq=512))
    p = prompt(10)
    h.add(p, max_tokens=2)
    h.run()
    rid = h.add(p, max_tokens=2)
    h.run()
    t = h.final(rid).timings
    assert t is not None and (t.cache_n, t.prompt_n) == (9, 1)
    assert h.token_ids(rid) == reference_tokens(p, 2)


def test_prefix_copied_from_a_busy_slot() -> None:
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=512))
    system = prompt(30)
    h.add([*system, 1], max_tokens=20)
    h.step()
    h.step()  # slot 0 is generating; its 31 prompt tokens are in KV
    before = h.runner.evaluated
    rid = h.add([*system, 2, 3], max_tokens=2)
    h.step()
    ops = h.runner.steps[-1].memory_ops
    assert ops[:2] == [SeqRemove(1), SeqCopy(0, 1, 0, 30)]
    assert h.runner.evaluated - before == 1 + 2  # slot 0's decode token, then only [2, 3]
    # Slot 0: 31 prompt + 2 decoded cells; slot 1 shares 30 of them and adds 2 of its own.
    assert h.sched.kv_cells_used == 31 + 2 + 2
    h.run()
    t = h.final(rid).timings
    assert t is not None and (t.cache_n, t.prompt_n) == (30, 2)
    assert h.token_ids(rid) == reference_tokens([*system, 2, 3], 2)


def test_prefix_cache_off_always_starts_from_scratch() -> None:
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=512, n_ctx_seq=512, prefix_cache=False))
    p = prompt(10)
    h.add(p, max_tokens=2)
    h.run()
    rid = h.add(p, max_tokens=2)
    h.run()
    assert h.final(rid).timings.cache_n == 0  # type: ignore[union-attr]
    assert SeqRemove(0) in h.runner.steps[-3].memory_ops  # admit, decode, free
    assert h.runner.evaluated == 2 * (10 + 1)


def test_unrelated_prompt_takes_the_least_recently_used_slot() -> None:
    h = Harness(SchedulerConfig(n_slots=3, n_ctx=512, n_ctx_seq=512, idle_cache_cells=512))
    for i in range(3):  # slots 0, 1, 2 used and released in that order
        h.add(prompt(5, base=1000 * (i + 1)), max_tokens=1)
        h.run()
    h.add([*prompt(5, base=1000 * 2), 5], max_tokens=1)  # slot 1 holds this prefix
    h.add(prompt(5, base=9000), max_tokens=1)  # no match anywhere: the LRU slot, 0
    h.step()
    setups = h.runner.steps[-1].sampler_setups
    assert [s.seq_id for s in setups] == [1, 0]


def test_sampler_setup_history_is_the_prompt_tail() -> None:
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=512, n_ctx_seq=512))
    rid = h.add(prompt(10), max_tokens=1, sampling=greedy(penalty_last_n=4))
    h.step()
    assert h.runner.steps[0].sampler_setups == [
        SamplerSetup(0, rid, greedy(penalty_last_n=4), tuple(prompt(10)[-4:]))
    ]
    h.run()
    assert h.runner.steps[-1].sampler_drops == [rid]
    assert not h.runner.chains and not h.runner.samplers, "an ended request's chain is freed"


def test_queue_full() -> None:
    sched = Scheduler(SchedulerConfig(n_slots=2, max_queue=3))
    for _ in range(5):  # 2 will take the free slots, 3 wait
        sched.add_request(GenerateRequest([1, 2], 4))
    with pytest.raises(QueueFull):
        sched.add_request(GenerateRequest([1, 2], 4))
    assert sched.queue_depth == 5


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "match"),
    [
        ([], 4, "empty"),
        (list(range(64)), 4, "64 tokens.*at most 63"),
        ([1], 0, "max_tokens"),
    ],
)
def test_rejected_requests(tokens: list[int], max_tokens: int, match: str) -> None:
    sched = Scheduler(SchedulerConfig(n_slots=1, n_ctx=64, n_ctx_seq=64))
    with pytest.raises(RequestRejected, match=match):
        sched.add_request(GenerateRequest(tokens, max_tokens))
    assert not sched.has_work()


def test_duplicate_request_id_is_rejected() -> None:
    sched = Scheduler(SchedulerConfig())
    sched.add_request(GenerateRequest([1], 1, request_id="x"))
    with pytest.raises(RequestRejected, match="already in use"):
        sched.add_request(GenerateRequest([2], 1, request_id="x"))


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="n_slots"):
        SchedulerConfig(n_slots=0)
    with pytest.raises(ValueError, match="n_ctx_seq"):
        SchedulerConfig(n_ctx=100, n_ctx_seq=200)
    with pytest.raises(ValueError, match="step_token_budget"):
        SchedulerConfig(n_slots=8, step_token_budget=4)
    with pytest.raises(ValueError, match="max_queue"):
        SchedulerConfig(max_queue=-1)


def test_common_prefix_len_across_blocks() -> None:
    a = list(range(1000))
    for cut in (0, 1, 255, 256, 257, 700, 999):
        b = [*a[:cut], -1, *a[cut + 1 :]]
        assert common_prefix_len(a, b, 10_000) == cut
    assert common_prefix_len(a, a, 10_000) == 1000
    assert common_prefix_len(a, a, 10) == 10
    assert common_prefix_len([], a, 5) == 0


def test_stats_and_has_work() -> None:
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=512, n_ctx_seq=512))
    assert not h.sched.has_work()
    h.add(prompt(6), max_tokens=3)
    h.add(prompt(6, base=400), max_tokens=3)
    assert h.sched.queue_depth == 2 and h.sched.slots_busy == 0
    h.step()
    assert h.sched.queue_depth == 1 and h.sched.slots_busy == 1
    assert h.sched.kv_cells_used == 6
    h.run()
    assert h.sched.slots_busy == 0 and h.sched.queue_depth == 0
    assert text_of(h.runner.kv.tokens(0)[6:]) == text_of(reference_tokens(prompt(6, base=400), 2))


def test_a_short_prompt_goes_whole_past_the_prefill_budget() -> None:
    """A chat turn within SHORT_PROMPT_CHUNKS budgets is read in one step beside the stream; one
    token longer, it goes a budget per step."""
    for length, whole in ((SHORT_PROMPT_CHUNKS * 8, True), (SHORT_PROMPT_CHUNKS * 8 + 1, False)):
        h = Harness(
            SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=256, step_token_budget=64, prefill_budget=8)
        )
        h.add(prompt(4), max_tokens=40)
        h.step()
        h.step()  # generating now
        first_steps = len(h.runner.steps)
        turn = h.add(prompt(length, base=1000), max_tokens=3)
        h.run()
        chunks = [c for out in h.runner.steps[first_steps:] for c in out.chunks if c.seq_id == 1]
        assert (len(chunks[0].tokens) == length) is whole
        assert h.token_ids(turn) == reference_tokens(prompt(length, base=1000), 3)


def test_prefill_budget_caps_prompt_chunks_only_while_others_generate() -> None:
    """A long prompt arriving while a stream generates is read 8 tokens a step, so the stream gets
    its token every step at the cost of 8 prompt tokens; alone, a prompt takes the whole step."""
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=256, step_token_budget=64, prefill_budget=8))
    streaming = h.add(prompt(4), max_tokens=40)
    h.step()
    h.step()  # generating now
    first_steps = len(h.runner.steps)
    long = h.add(prompt(100, base=1000), max_tokens=3)
    h.run()
    during = h.runner.steps[first_steps:]
    long_seq = 1
    prompt_chunks = [c for out in during for c in out.chunks if c.seq_id == long_seq and len(c.tokens) > 1]
    assert prompt_chunks and all(len(c.tokens) <= 8 for c in prompt_chunks)
    assert sum(len(c.tokens) for c in prompt_chunks) >= 99
    for out in during[: len(prompt_chunks)]:  # every step of that prefill also decoded the stream
        assert any(c.seq_id == 0 and len(c.tokens) == 1 for c in out.chunks)
    assert h.token_ids(streaming) == reference_tokens(prompt(4), 40)
    assert h.token_ids(long) == reference_tokens(prompt(100, base=1000), 3)
    alone = Harness(
        SchedulerConfig(n_slots=2, n_ctx=512, n_ctx_seq=256, step_token_budget=64, prefill_budget=8)
    )
    alone.add(prompt(100, base=1000), max_tokens=1)
    alone.step()
    assert alone.runner.steps[0].num_tokens == 64, "nothing generates: the prompt takes the whole step"
    with pytest.raises(ValueError, match="prefill_budget"):
        SchedulerConfig(prefill_budget=0)
