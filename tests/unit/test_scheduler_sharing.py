"""A prefix being computed is shared: requests arriving together at a cold cache evaluate it once.

Requests that share a system prompt and arrive in the same step find it in no slot yet. The first
admitted computes it; the others hold their slots (FCFS) with no prompt chunks until its KV covers
the shared prefix, then copy it and prefill only their own tails. Counted in the fake runner:
the shared prefix's tokens decoded at their positions, over every sequence and step.
"""

from __future__ import annotations

import random

import pytest
from fake_runner import FakeRunner, reference_tokens
from sched_harness import Harness

from outpost.messages import FinishReason, QueueFull
from outpost.scheduler import SchedulerConfig
from outpost.scheduler.output import SeqCopy, SeqRemove

PREFIX = list(range(100, 200))  # the shared "system prompt": 100 tokens


def tail(i: int, n: int = 5) -> list[int]:
    return [1000 + 10 * i + k for k in range(n)]


def config(n_slots: int = 8, budget: int = 512, shared_kv: bool = True, **kwargs: object) -> SchedulerConfig:
    return SchedulerConfig(
        n_slots=n_slots,
        n_ctx=512 * n_slots,
        n_ctx_seq=512,
        step_token_budget=budget,
        shared_kv=shared_kv,
        **kwargs,  # type: ignore[arg-type]
    )


def prefix_evaluations(h: Harness) -> int:
    """PREFIX tokens decoded successfully at their own positions, summed over sequences and steps."""
    return sum(
        token == PREFIX[c.start_pos + i]
        for out, status in zip(h.runner.steps, h.runner.statuses, strict=True)
        if status == 0
        for c in out.chunks
        for i, token in enumerate(c.tokens)
        if c.start_pos + i < len(PREFIX)
    )


def cache_and_prompt_n(h: Harness, rid: str) -> tuple[int, int]:
    t = h.final(rid).timings
    assert t is not None
    return t.cache_n, t.prompt_n


def copies_into(h: Harness, seq_id: int) -> list[SeqCopy]:
    return [
        op for out in h.runner.steps for op in out.memory_ops if isinstance(op, SeqCopy) and op.dst == seq_id
    ]


@pytest.mark.parametrize("shared_kv", [True, False])
@pytest.mark.parametrize("budget", [512, 32])
def test_eight_requests_arriving_together_evaluate_the_shared_prefix_once(
    shared_kv: bool, budget: int
) -> None:
    h = Harness(config(budget=budget, shared_kv=shared_kv, copy_min_tokens=1 if shared_kv else 16))
    prompts = [[*PREFIX, *tail(i)] for i in range(8)]
    rids = [h.add(p, max_tokens=6) for p in prompts]
    h.run()
    assert prefix_evaluations(h) == len(PREFIX)
    decode_tokens = 8 * (6 - 1)
    assert h.runner.evaluated == len(PREFIX) + 8 * 5 + decode_tokens
    assert cache_and_prompt_n(h, rids[0]) == (0, 105)
    for rid, p in zip(rids, prompts, strict=True):
        assert h.final(rid).finish_reason == FinishReason.LENGTH
        assert h.token_ids(rid) == reference_tokens(p, 6)
    for i, rid in enumerate(rids[1:], start=1):
        assert cache_and_prompt_n(h, rid) == (100, 5)
        seq = h.runner.steps[0].sampler_setups[i].seq_id  # its slot: setups go in admission order
        assert copies_into(h, seq) == [SeqCopy(0, seq, 0, 100)]
    firsts = [h.first_event_step[r] for r in rids]
    assert firsts == sorted(firsts), "FCFS: no waiter overtakes the request it waits for"


def test_a_waiter_leaves_the_prompt_budget_to_others() -> None:
    """While B waits on A, an unrelated C admitted after B prefills beside A."""
    h = Harness(config(n_slots=3, budget=64))
    a = h.add([*PREFIX, *tail(0)], max_tokens=3)
    b = h.add([*PREFIX, *tail(1)], max_tokens=3)
    c = h.add(list(range(3000, 3040)), max_tokens=3)
    h.step()
    assert [(ch.seq_id, len(ch.tokens)) for ch in h.runner.steps[0].chunks] == [(0, 64)]
    h.step()
    assert [(ch.seq_id, len(ch.tokens)) for ch in h.runner.steps[1].chunks] == [(0, 41), (2, 23)]
    h.step()  # A's prompt is in KV: B copies it and prefills its tail
    assert h.runner.steps[2].memory_ops[:2] == [SeqRemove(1), SeqCopy(0, 1, 0, 100)]
    assert (1, 5) in [(ch.seq_id, len(ch.tokens)) for ch in h.runner.steps[2].chunks]
    h.run()
    assert prefix_evaluations(h) == len(PREFIX)
    assert h.token_ids(b) == reference_tokens([*PREFIX, *tail(1)], 3)
    assert h.token_ids(c) == reference_tokens(list(range(3000, 3040)), 3)
    assert h.final(a).finish_reason == FinishReason.LENGTH


def test_no_wait_for_a_prefix_shorter_than_copy_min() -> None:
    h = Harness(config(n_slots=2, copy_min_tokens=101))
    rids = [h.add([*PREFIX, *tail(i)], max_tokens=2) for i in range(2)]
    h.step()
    assert [len(ch.tokens) for ch in h.runner.steps[0].chunks] == [105, 105]
    h.run()
    assert [cache_and_prompt_n(h, r) for r in rids] == [(0, 105), (0, 105)]


def test_no_wait_without_a_prefix_cache() -> None:
    h = Harness(config(n_slots=2, prefix_cache=False))
    h.add([*PREFIX, *tail(0)], max_tokens=2)
    h.add([*PREFIX, *tail(1)], max_tokens=2)
    h.run()
    assert prefix_evaluations(h) == 2 * len(PREFIX)


@pytest.mark.parametrize("how", ["abort", "deadline"])
def test_waiters_finish_when_their_source_leaves_mid_prefill(how: str) -> None:
    """The source ends after 32 of its 100 shared tokens: its cache stays, the first waiter copies
    those 32 and computes the rest, and the other waiters now wait on it."""
    h = Harness(config(n_slots=4, budget=16))
    deadline = {"deadline": h.now + 1.5 * h.dt} if how == "deadline" else {}
    source = h.add([*PREFIX, *tail(0)], max_tokens=4, **deadline)
    prompts = [[*PREFIX, *tail(i)] for i in range(1, 4)]
    waiters = [h.add(p, max_tokens=4) for p in prompts]
    h.step()
    h.step()  # 32 prefix tokens in the source's KV
    if how == "abort":
        h.sched.abort(source)
    h.run()
    expected = FinishReason.ABORT if how == "abort" else FinishReason.TIMEOUT
    assert h.final(source).finish_reason == expected
    assert cache_and_prompt_n(h, source) == (0, 32)
    assert prefix_evaluations(h) == len(PREFIX), "the 32 tokens the source computed are reused"
    assert cache_and_prompt_n(h, waiters[0]) == (32, 73)
    for rid in waiters[1:]:
        assert cache_and_prompt_n(h, rid) == (100, 5)
    for rid, p in zip(waiters, prompts, strict=True):
        assert h.token_ids(rid) == reference_tokens(p, 4)


def test_a_source_that_finishes_leaves_its_prefix_to_waiters_before_a_newcomer_takes_its_slot() -> None:
    """The source samples one token and ends; a newcomer arrives in that step and takes the
    source's freed slot (clearing it). The waiter copied from it first."""
    h = Harness(config(n_slots=2, budget=32))
    source = h.add([*PREFIX, *tail(0)], max_tokens=1)
    waiter = h.add([*PREFIX, *tail(1)], max_tokens=3)
    while not h.events[source]:
        h.step()
    newcomer = h.add(list(range(5000, 5010)), max_tokens=2)
    h.run()
    assert cache_and_prompt_n(h, waiter) == (100, 5)
    assert prefix_evaluations(h) == len(PREFIX)
    assert h.token_ids(waiter) == reference_tokens([*PREFIX, *tail(1)], 3)
    assert h.token_ids(newcomer) == reference_tokens(list(range(5000, 5010)), 2)


@pytest.mark.parametrize("how", ["abort", "deadline"])
def test_a_waiter_that_ends_while_waiting(how: str) -> None:
    h = Harness(config(n_slots=3, budget=16))
    deadline = {"deadline": h.now + 1.5 * h.dt} if how == "deadline" else {}
    source = h.add([*PREFIX, *tail(0)], max_tokens=4)
    gone = h.add([*PREFIX, *tail(1)], max_tokens=4, **deadline)
    stays = h.add([*PREFIX, *tail(2)], max_tokens=4)
    h.step()
    h.step()
    if how == "abort":
        h.sched.abort(gone)
    h.run()
    expected = FinishReason.ABORT if how == "abort" else FinishReason.TIMEOUT
    assert [e.finish_reason for e in h.events[gone]] == [expected]
    assert cache_and_prompt_n(h, gone) == (0, 0)
    assert not copies_into(h, 1), "its slot got no copy"
    assert prefix_evaluations(h) == len(PREFIX)
    assert cache_and_prompt_n(h, stays) == (100, 5)
    assert h.token_ids(source) == reference_tokens([*PREFIX, *tail(0)], 4)
    assert h.token_ids(stays) == reference_tokens([*PREFIX, *tail(2)], 4)


def test_source_and_waiter_preempted_under_kv_pressure_recompute_exactly() -> None:
    """120 cells: a generating request G, the source S prefilling 105 tokens, W waiting on S. The
    cells run out before S's prompt is in: W (youngest) then S are preempted, wait until G ends,
    and come back in their order: S computes the prefix again, W copies it."""
    h = Harness(SchedulerConfig(n_slots=3, n_ctx=120, n_ctx_seq=120, step_token_budget=16))
    g_prompt = list(range(5000, 5008))
    g = h.add(g_prompt, max_tokens=60)
    s = h.add([*PREFIX, *tail(0)], max_tokens=4)
    w = h.add([*PREFIX, *tail(1)], max_tokens=4)
    h.run()
    admissions = [
        setup.request_id for out in h.runner.steps for setup in out.sampler_setups if setup.request_id != g
    ]
    assert admissions == [s, w, s, w], "both were preempted once and admitted again in order"
    assert 1 not in h.runner.statuses
    assert h.token_ids(g) == reference_tokens(g_prompt, 60)
    assert h.token_ids(s) == reference_tokens([*PREFIX, *tail(0)], 4)
    assert h.token_ids(w) == reference_tokens([*PREFIX, *tail(1)], 4)
    assert cache_and_prompt_n(h, w) == (100, 5)
    assert prefix_evaluations(h) > len(PREFIX)  # S's first pass was lost to the preemption


@pytest.mark.parametrize("seed", range(8))
def test_random_bursts_sharing_prefixes_keep_every_invariant(seed: int) -> None:
    """Bursts of requests from a few prompt families (nested prefixes), aborts, deadlines, a tight
    cache and fatal errors: the harness checks the KV view every step; tokens are never wrong."""
    rng = random.Random(seed)
    runner = FakeRunner(capacity=rng.choice([None, 300]))
    shared_kv = rng.random() < 0.5
    config = SchedulerConfig(
        n_slots=rng.choice([4, 8]),
        n_ctx=rng.choice([256, 512]),
        n_ctx_seq=128,
        step_token_budget=rng.choice([8, 16, 32]),
        max_queue=16,
        shared_kv=shared_kv,
        copy_min_tokens=rng.choice([1, 16]),
    )
    h = Harness(config, runner)
    families = [list(range(base, base + 100)) for base in (7000, 8000)]
    cases: dict[str, tuple[list[int], int]] = {}
    for _ in range(200):
        if rng.random() < 0.2:
            for _ in range(rng.randint(1, 5)):  # a burst, queued before the next step
                family = rng.choice(families)
                p = family[: rng.randint(20, 100)] + tail(rng.randrange(50), rng.randint(1, 10))
                deadline = h.now + rng.uniform(0.02, 0.5) if rng.random() < 0.15 else None
                try:
                    rid = h.add(p, max_tokens=(n := rng.randint(1, 20)), deadline=deadline)
                except QueueFull:
                    break
                cases[rid] = (p, n)
        if cases and rng.random() < 0.05:
            h.sched.abort(rng.choice(list(cases)))
        if rng.random() < 0.01:
            runner.fail_next = -1
        h.step()
        waiting = [s for s in h.sched._running if s.awaiting is not None]
        assert h.sched._n_awaiting == len(waiting)
        assert all(s.n_cached == 0 for s in waiting), "a waiter holds nothing until its copy"
    h.run()
    assert h.sched._n_awaiting == 0
    for rid, (p, n) in cases.items():
        got = h.token_ids(rid)
        assert got == reference_tokens(p, n)[: len(got)], rid
        if h.final(rid).finish_reason == FinishReason.LENGTH:
            assert len(got) == n
    assert not runner.chains and not runner.samplers
