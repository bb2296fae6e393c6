"""Slot placement with a KV stream per slot: busy slots stay in runs of consecutive ids.

llama.cpp decodes each run of consecutive busy seq ids in its own pass over the weights when every
slot has its own stream, so the scheduler admits into slots that add no run and, when a gap
between busy slots outlives a few steps, moves the highest request down into it. Tokens must be
exactly those of an undisturbed run (the fake runner's sampling is a function of the KV history).
"""

from __future__ import annotations

from fake_runner import reference_tokens
from sched_harness import Harness

from outpost.scheduler import SchedulerConfig
from outpost.scheduler.output import SeqCopy
from outpost.scheduler.pool import SlotPool, runs_added
from outpost.scheduler.scheduler import COMPACT_AFTER_STEPS, COMPACT_MIN_TOKENS_LEFT


def prompt(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def streams(n_slots: int = 4, **kwargs: object) -> SchedulerConfig:
    return SchedulerConfig(
        n_slots=n_slots, n_ctx=128 * n_slots, n_ctx_seq=128, step_token_budget=64, shared_kv=False, **kwargs
    )  # type: ignore[arg-type]


def busy_ids(h: Harness) -> list[int]:
    return [s.seq_id for s in h.sched._pool.slots if s.busy]


def test_runs_added_counts_runs_of_consecutive_ids() -> None:
    assert runs_added(set(), 3) == 1
    assert runs_added({0, 1}, 2) == 0
    assert runs_added({0, 2}, 1) == -1
    assert runs_added({0}, 5) == 1


def test_admission_fills_the_gap_between_busy_slots() -> None:
    pool = SlotPool(4, prefix_cache=True, compact=True)
    for i in (0, 1, 3):
        pool.acquire(pool.slots[i])
    assert pool.plan(prompt(8)).dst.seq_id == 2


def test_admission_keeps_the_idle_cache_that_loses_most() -> None:
    """Nothing busy: any slot is one run, so the request takes an empty slot, not slot 0's cache."""
    pool = SlotPool(4, prefix_cache=True, compact=True)
    pool.slots[0].append(prompt(40, base=1000), pool.new_origin())
    plan = pool.plan(prompt(10, base=5000))
    assert plan.dst.seq_id == 1 and plan.reuse == 0


def test_a_prefix_far_away_is_copied_next_to_the_busy_run() -> None:
    """Busy slot 0; slot 3 holds the prompt's prefix: slot 1 takes the request and copies it."""
    pool = SlotPool(4, prefix_cache=True, compact=True, copy_min=16)
    pool.acquire(pool.slots[0])
    pool.slots[3].append(prompt(40, base=1000), pool.new_origin())
    plan = pool.plan([*prompt(40, base=1000), 7, 8])
    assert (plan.dst.seq_id, plan.reuse, plan.src) == (1, 40, pool.slots[3])
    short = pool.plan([*prompt(10, base=1000), 7])  # 10 < copy_min: evaluated again, not copied
    assert short.src is None and short.reuse == 0


def test_own_prefix_next_to_the_run_wins_without_a_copy() -> None:
    pool = SlotPool(4, prefix_cache=True, compact=True, copy_min=16)
    pool.acquire(pool.slots[0])
    pool.slots[1].append(prompt(40, base=1000), pool.new_origin())
    plan = pool.plan([*prompt(40, base=1000), 7])
    assert (plan.dst.seq_id, plan.reuse, plan.src) == (1, 40, None)


def test_busy_slots_in_one_run_are_never_moved() -> None:
    h = Harness(streams())
    first = h.add(prompt(6, base=1000), max_tokens=3)
    second = h.add(prompt(6, base=2000), max_tokens=5)
    third = h.add(prompt(12, base=3000), max_tokens=4 * COMPACT_MIN_TOKENS_LEFT)
    h.step()
    assert busy_ids(h) == [0, 1, 2]
    for rid, busy in ((first, [1, 2]), (second, [2])):  # slots freed below one run: no gap
        while not h.events[rid][-1].finished:
            h.step()
        assert busy_ids(h) == busy
    h.run()
    assert _copies(h) == 0
    assert h.token_ids(third) == reference_tokens(prompt(12, base=3000), 4 * COMPACT_MIN_TOKENS_LEFT)


def test_a_lasting_gap_is_closed_and_the_moved_request_continues_exactly() -> None:
    h = Harness(streams())
    low = h.add(prompt(6, base=1000), max_tokens=60)
    gone = h.add(prompt(6, base=2000), max_tokens=3)
    high = h.add(prompt(6, base=3000), max_tokens=60)
    while not h.events[gone] or not h.events[gone][-1].finished:
        h.step()
    assert busy_ids(h) == [0, 2]
    for _ in range(COMPACT_AFTER_STEPS - 1):
        h.step()
    assert busy_ids(h) == [0, 2] and _copies(h) == 0  # a new arrival might still fill the gap
    h.step()
    assert busy_ids(h) == [0, 1] and _copies(h) == 1
    chains = [s for out in h.runner.steps for s in out.sampler_setups if s.request_id == high]
    assert [s.seq_id for s in chains] == [2, 1]  # the same request's chain, now sampling seq 1
    h.run()
    assert h.token_ids(low) == reference_tokens(prompt(6, base=1000), 60)
    assert h.token_ids(high) == reference_tokens(prompt(6, base=3000), 60)


def test_no_move_for_a_request_about_to_end() -> None:
    h = Harness(streams(n_slots=3))
    h.add(prompt(6, base=1000), max_tokens=60)
    gone = h.add(prompt(6, base=2000), max_tokens=3)
    ending = h.add(prompt(6, base=3000), max_tokens=COMPACT_MIN_TOKENS_LEFT + 3)
    while not h.events[gone] or not h.events[gone][-1].finished:
        h.step()
    assert busy_ids(h) == [0, 2]
    for _ in range(3 * COMPACT_AFTER_STEPS):
        h.step()
    assert _copies(h) == 0 and busy_ids(h) == [0, 2]  # fewer than the minimum left to generate
    h.run()
    assert h.token_ids(ending) == reference_tokens(prompt(6, base=3000), COMPACT_MIN_TOKENS_LEFT + 3)


def _copies(h: Harness) -> int:
    return sum(isinstance(op, SeqCopy) for out in h.runner.steps for op in out.memory_ops)


def test_one_pool_keeps_a_long_idle_cache_over_a_few_shared_template_tokens() -> None:
    """In one KV pool a request with only a chat template's first tokens in common takes an empty
    slot, not the slot of a long idle cache (which a later turn of that chat wants)."""
    pool = SlotPool(4, prefix_cache=True, compact=False)
    template = [1, 2, 3, 4]
    pool.slots[0].append([*template, *prompt(60, base=1000)], pool.new_origin())
    plan = pool.plan([*template, *prompt(20, base=5000)])
    assert plan.dst.seq_id != 0 and plan.reuse == 4 and plan.src is pool.slots[0]  # copied: tags cells
    again = pool.plan([*template, *prompt(60, base=1000), 7])  # the chat's next turn: its own slot
    assert (again.dst.seq_id, again.reuse, again.src) == (0, 64, None)
