"""KV pressure (eviction, preemption, decode status 1), fatal decode errors, many requests at once."""

from __future__ import annotations

import random

import pytest
from fake_runner import FakeRunner, reference_tokens, text_of
from sched_harness import Harness

from outpost.messages import FinishReason, QueueFull
from outpost.scheduler import SchedulerConfig
from outpost.scheduler.output import SeqRemove


def prompt(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def setups_with_prompt(h: Harness, p: list[int]) -> list[tuple[int, ...]]:
    """Histories of every sampler chain built for the request with prompt `p` (penalty_last_n=64)."""
    return [
        s.history for out in h.runner.steps for s in out.sampler_setups if s.history[: len(p)] == tuple(p)
    ]


def test_idle_caches_are_evicted_lru_first_before_admission() -> None:
    h = Harness(SchedulerConfig(n_slots=3, n_ctx=64, n_ctx_seq=32, step_token_budget=32, idle_cache_cells=64))
    for base in (1000, 2000):  # slots 0 then 1 keep 21 cells each
        h.add(prompt(20, base=base), max_tokens=2)
        h.run()
    assert h.sched.kv_cells_used == 42
    h.add(prompt(30, base=3000), max_tokens=2)  # 30 cells needed, 22 free: slot 0 goes
    h.step()
    assert SeqRemove(0) in h.runner.steps[-1].memory_ops
    assert len(h.sched.cached_tokens(1)) == 21 and len(h.sched.cached_tokens(0)) == 0
    h.run()
    assert h.runner.statuses.count(1) == 0


def test_full_cache_preempts_the_youngest_and_recomputes() -> None:
    """Exact cell accounting: the scheduler preempts before llama.cpp would say 'no slot'."""
    h = Harness(SchedulerConfig(n_slots=4, n_ctx=64, n_ctx_seq=64, step_token_budget=16))
    prompts = [prompt(8, base=100 * (i + 1)) for i in range(4)]
    rids = [h.add(p, max_tokens=20) for p in prompts]
    h.run()
    assert 1 not in h.runner.statuses
    for rid, p in zip(rids, prompts, strict=True):
        assert h.final(rid).finish_reason == FinishReason.LENGTH
        assert h.token_ids(rid) == reference_tokens(p, 20)
        assert h.text(rid) == text_of(reference_tokens(p, 20))
    histories = setups_with_prompt(h, prompts[-1])
    assert len(histories) >= 2, "the youngest request was never preempted"
    resumed = histories[1]  # prompt + the tokens generated before the preemption
    assert len(resumed) > 8 and list(resumed[8:]) == reference_tokens(prompts[-1], len(resumed) - 8)
    assert h.final(rids[-1]).timings.predicted_n == 20  # type: ignore[union-attr]


def test_a_preempted_request_resumes_with_its_own_sampler_chain() -> None:
    """Chains carry state (grammar position, penalty window, RNG): a preempted request must come
    back with the chain it had, so its text is exactly what it would have been without pressure."""

    def run(n_ctx: int) -> tuple[Harness, list[list[int]], list[str]]:
        h = Harness(
            SchedulerConfig(n_slots=4, n_ctx=n_ctx, n_ctx_seq=64, step_token_budget=16),
            FakeRunner(stateful_chains=True),
        )
        rids = [h.add(prompt(8, base=100 * (i + 1)), max_tokens=20) for i in range(4)]
        h.run()
        return h, [h.token_ids(r) for r in rids], rids

    roomy, expected, _ = run(n_ctx=512)
    assert len(setups_with_prompt(roomy, prompt(8, base=400))) == 1, "no pressure, no preemption"
    tight, got, _ = run(n_ctx=64)
    assert len(setups_with_prompt(tight, prompt(8, base=400))) >= 2, "the youngest was never preempted"
    assert got == expected
    assert [len(t) for t in got] == [20] * 4
    assert expected[3] != reference_tokens(prompt(8, base=400), 20), "the chain state steers the text"
    assert tight.runner.chains_built == 4, "one chain per request, preempted or not"
    assert not tight.runner.chains, "every chain is freed when its request ends"


def test_no_kv_slot_evicts_idle_caches_first() -> None:
    runner = FakeRunner(capacity=40)
    h = Harness(
        SchedulerConfig(n_slots=2, n_ctx=128, n_ctx_seq=64, step_token_budget=32, idle_cache_cells=128),
        runner,
    )
    h.add(prompt(20), max_tokens=2)
    h.run()  # slot 0 keeps 21 cells
    rid = h.add(prompt(25, base=500), max_tokens=3)  # 21 + 25 > 40: llama.cpp says 1
    h.run()
    assert runner.statuses.count(1) == 1
    failed = runner.statuses.index(1)
    retry = runner.steps[failed + 1]
    assert SeqRemove(0) in retry.memory_ops and retry.chunks  # evicted, then the same work again
    assert h.token_ids(rid) == reference_tokens(prompt(25, base=500), 3)
    assert len(setups_with_prompt(h, prompt(25, base=500))) == 1  # no preemption was needed


def test_no_kv_slot_preempts_and_everyone_completes() -> None:
    runner = FakeRunner(capacity=48)  # the scheduler believes in 128 cells
    h = Harness(SchedulerConfig(n_slots=4, n_ctx=128, n_ctx_seq=64, step_token_budget=16), runner)
    prompts = [prompt(8, base=100 * (i + 1)) for i in range(4)]
    rids = [h.add(p, max_tokens=12) for p in prompts]
    h.run()
    assert 1 in runner.statuses
    for rid, p in zip(rids, prompts, strict=True):
        assert h.final(rid).finish_reason == FinishReason.LENGTH
        assert h.token_ids(rid) == reference_tokens(p, 12)
        assert h.text(rid) == text_of(reference_tokens(p, 12))


def test_lone_request_that_never_fits_fails_instead_of_looping() -> None:
    runner = FakeRunner(capacity=10)
    h = Harness(SchedulerConfig(n_slots=1, n_ctx=64, n_ctx_seq=64, step_token_budget=32), runner)
    rid = h.add(prompt(20), max_tokens=2)
    h.run(max_steps=20)
    final = h.final(rid)
    assert final.finish_reason == FinishReason.ERROR and final.error and "n_ctx" in final.error


def test_fatal_decode_error_fails_only_the_requests_in_that_step() -> None:
    runner = FakeRunner()
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=128, n_ctx_seq=64, step_token_budget=2), runner)
    a = h.add(prompt(10), max_tokens=3)
    b = h.add(prompt(10, base=300), max_tokens=3)  # admitted, but the budget leaves it no chunk
    c = h.add(prompt(10, base=500), max_tokens=3)  # waiting
    runner.fail_next, runner.fail_partial = -3, True
    h.run()
    final = h.final(a)
    assert final.finish_reason == FinishReason.ERROR and final.error == "boom -3"
    assert SeqRemove(0) in runner.steps[1].memory_ops  # the partial write is cleared
    for rid, base in ((b, 300), (c, 500)):
        assert h.token_ids(rid) == reference_tokens(prompt(10, base=base), 3)


def test_fatal_error_while_generating_then_serving_goes_on() -> None:
    runner = FakeRunner()
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=128, n_ctx_seq=64, step_token_budget=16), runner)
    rids = [h.add(prompt(4, base=b), max_tokens=10) for b in (100, 200)]
    h.step()
    h.step()
    runner.fail_next = 2
    h.step()
    assert all(h.final(r).finish_reason == FinishReason.ERROR for r in rids)
    assert [len(h.token_ids(r)) for r in rids] == [2, 2]
    later = h.add(prompt(4, base=300), max_tokens=4)
    h.run()
    assert h.token_ids(later) == reference_tokens(prompt(4, base=300), 4)


def test_missing_sampled_token_fails_that_request() -> None:
    runner = FakeRunner()
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=128, n_ctx_seq=64, step_token_budget=16), runner)
    a = h.add(prompt(4), max_tokens=5)
    b = h.add(prompt(4, base=300), max_tokens=5)
    runner.drop_sample_for = 0
    h.run()
    assert h.final(a).finish_reason == FinishReason.ERROR
    assert h.token_ids(b) == reference_tokens(prompt(4, base=300), 5)


def test_sixteen_concurrent_requests_with_shared_prefixes() -> None:
    rng = random.Random(3)
    system = prompt(24, base=5000)
    cases = []
    for i in range(16):
        p = (system if i % 2 else []) + prompt(rng.randint(1, 30), base=100 * (i + 1))
        cases.append((p, rng.randint(1, 25)))
    for n_slots, n_ctx, capacity in ((16, 2048, None), (8, 256, 200)):
        runner = FakeRunner(capacity=capacity)
        config = SchedulerConfig(n_slots=n_slots, n_ctx=n_ctx, n_ctx_seq=96, step_token_budget=48)
        h = Harness(config, runner)
        rids = [h.add(p, max_tokens=n) for p, n in cases]
        h.run()
        for rid, (p, n) in zip(rids, cases, strict=True):
            assert h.final(rid).finish_reason == FinishReason.LENGTH
            assert h.token_ids(rid) == reference_tokens(p, n), rid
        evaluated_prompts = sum(h.final(r).timings.prompt_n for r in rids)  # type: ignore[union-attr]
        cached = sum(h.final(r).timings.cache_n for r in rids)  # type: ignore[union-attr]
        # With 16 slots all start in the same step, before anything is cached to share.
        assert cached > 0 or n_slots == 16, "the shared system prompt was never reused"
        assert evaluated_prompts + cached >= sum(len(p) for p, _ in cases)


@pytest.mark.parametrize("seed", range(6))
def test_random_traffic_keeps_every_invariant(seed: int) -> None:
    """Arrivals, aborts, deadlines, a too-small real cache and fatal errors, all mixed."""
    rng = random.Random(seed)
    runner = FakeRunner(capacity=rng.choice([None, 150, 220]))
    config = SchedulerConfig(
        n_slots=rng.choice([1, 3, 6]),
        n_ctx=256,
        n_ctx_seq=rng.choice([48, 96]),
        step_token_budget=rng.choice([8, 24, 64]),
        max_queue=8,
        prefix_cache=rng.random() < 0.8,
    )
    h = Harness(config, runner)
    system = prompt(20, base=7000)
    cases: dict[str, tuple[list[int], int]] = {}
    for _ in range(300):
        if rng.random() < 0.3:
            p = (system if rng.random() < 0.5 else []) + prompt(
                rng.randint(1, 25), base=rng.randrange(1, 50) * 100
            )
            deadline = h.now + rng.uniform(0.05, 1.0) if rng.random() < 0.2 else None
            try:
                rid = h.add(p, max_tokens=(n := rng.randint(1, 30)), deadline=deadline)
            except QueueFull:
                continue
            cases[rid] = (p, n)
        if cases and rng.random() < 0.05:
            h.sched.abort(rng.choice(list(cases)))
        if rng.random() < 0.02:
            runner.fail_next = -1
        h.step()
    h.run()
    for rid, (p, n) in cases.items():
        final = h.final(rid)
        got = h.token_ids(rid)
        expected = reference_tokens(p, n)
        assert got == expected[: len(got)], rid  # never a wrong or repeated token
        if final.finish_reason == FinishReason.LENGTH:
            assert len(got) == min(n, config.n_ctx_seq - len(p))
    assert not runner.chains and not runner.samplers, "no sampler chain outlives its request"


def test_admission_drops_idle_caches_beyond_the_budget() -> None:
    """In a unified KV cache every decode attends over every used cell: idle caches that the new
    request does not reuse go when it is admitted (budget 0, the default)."""
    h = Harness(SchedulerConfig(n_slots=3, n_ctx=256, n_ctx_seq=64, step_token_budget=32))
    h.add(prompt(20, base=1000), max_tokens=2)
    h.run()
    assert h.sched.kv_cells_used == 21  # nothing admitted since: the cache stays
    h.add(prompt(10, base=3000), max_tokens=2)  # reuses nothing: goes to slot 1, slot 0 goes
    h.step()
    assert SeqRemove(0) in h.runner.steps[-1].memory_ops
    h.run()
    assert h.sched.kv_cells_used == 11


def test_admission_keeps_the_reused_cache_and_the_newest_within_budget() -> None:
    h = Harness(
        SchedulerConfig(n_slots=4, n_ctx=256, n_ctx_seq=64, step_token_budget=32, idle_cache_cells=25)
    )
    shared = prompt(20, base=1000)
    for base in (2000, 3000):  # slots 0 and 1: unrelated, 21 cells each, slot 1 the newer
        h.add(prompt(20, base=base), max_tokens=2)
        h.run()
    h.add(shared, max_tokens=2)  # slot 2; budget 25 keeps slot 1 (21 cells), drops slot 0
    h.step()
    assert SeqRemove(0) in h.runner.steps[-1].memory_ops
    assert SeqRemove(1) not in h.runner.steps[-1].memory_ops
    h.run()
    rid = h.add([*shared, 7, 8], max_tokens=2)  # reuses slot 2's prefix; slot 1 still fits the budget
    h.run()
    assert h.final(rid).timings is not None and h.final(rid).timings.cache_n == 20
    assert len(h.sched.cached_tokens(1)) == 21


def test_without_prefix_cache_no_idle_cache_survives_an_admission() -> None:
    h = Harness(SchedulerConfig(n_slots=2, n_ctx=256, n_ctx_seq=64, prefix_cache=False, idle_cache_cells=256))
    h.add(prompt(20, base=1000), max_tokens=2)
    h.run()
    h.add(prompt(20, base=1000), max_tokens=2)  # same prompt, but no prefix cache: slot 1, slot 0 dropped
    h.step()
    assert SeqRemove(0) in h.runner.steps[-1].memory_ops


def test_per_slot_streams_keep_idle_caches_for_later_reuse() -> None:
    """With a KV stream per slot an idle cache costs running requests nothing: admissions keep it
    (budget 0 notwithstanding), and a later request reuses it."""
    h = Harness(SchedulerConfig(n_slots=3, n_ctx=192, n_ctx_seq=64, step_token_budget=32, shared_kv=False))
    first = prompt(20, base=1000)
    h.add(first, max_tokens=2)
    h.run()
    h.add(prompt(10, base=3000), max_tokens=2)  # reuses nothing: slot 1; slot 0 keeps its cache
    h.step()
    assert SeqRemove(0) not in h.runner.steps[-1].memory_ops
    h.run()
    rid = h.add([*first, 7, 8], max_tokens=2)
    h.run()
    final = h.final(rid)
    assert final.timings is not None and final.timings.cache_n == 20
