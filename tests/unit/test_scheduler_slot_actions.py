"""llama-server's slot actions in the scheduler: which slots they may touch, and the KV they leave.

The engine thread applies `take_memory_ops()` before it reads or writes a sequence, then reports
a restore with `restored()`; here the fake KV plays llama.cpp's part, and the harness checks every
step that the scheduler's view of each slot is what the KV holds.
"""

from __future__ import annotations

import pytest
from fake_runner import FakeKV
from sched_harness import Harness

from outpost.messages import RequestRejected, SlotActionError
from outpost.scheduler import SchedulerConfig
from outpost.scheduler.output import MemoryOp, SeqCopy, SeqRemove

PROMPT = list(range(100, 130))


def harness() -> Harness:
    config = SchedulerConfig(n_slots=2, n_ctx=128, n_ctx_seq=64, step_token_budget=16, idle_cache_cells=128)
    return Harness(config)


def apply(kv: FakeKV, ops: list[MemoryOp]) -> None:
    for op in ops:
        if isinstance(op, SeqRemove):
            kv.seq_rm(op.seq_id, op.p0, op.p1)
        elif isinstance(op, SeqCopy):
            kv.seq_cp(op.src, op.dst, op.p0, op.p1)


def test_a_busy_or_unknown_slot_is_refused() -> None:
    h = harness()
    h.add(PROMPT, max_tokens=4)
    h.step()
    busy = next(i for i in range(2) if h.sched.cached_tokens(i))
    with pytest.raises(SlotActionError) as exc:
        h.sched.erase_slot(busy)
    assert exc.value.reason == "busy"
    for bad in (-1, 2):
        with pytest.raises(SlotActionError) as exc:
            h.sched.idle_slot(bad)
        assert exc.value.reason == "unknown_slot"


def test_erase_drops_the_cache_and_restore_makes_it_one_again() -> None:
    h = harness()
    first = h.add(PROMPT, max_tokens=4)
    h.run()
    seq = next(i for i in range(2) if h.sched.cached_tokens(i))
    held = list(h.sched.cached_tokens(seq))
    assert h.sched.erase_slot(seq) == len(held) and h.sched.cached_tokens(seq) == ()
    apply(h.runner.kv, h.sched.take_memory_ops())
    other = 1 - seq
    h.sched.clear_for_restore(other, len(held))
    apply(h.runner.kv, h.sched.take_memory_ops())
    for pos, token in enumerate(held):  # llama_state_seq_load_file, as the engine thread calls it
        h.runner.kv.add(other, pos, token)
    h.sched.restored(other, held)
    again = h.add(PROMPT, max_tokens=4)
    h.run()
    assert h.final(again).timings.cache_n == len(PROMPT) - 1  # type: ignore[union-attr]
    assert h.final(first).timings.cache_n == 0  # type: ignore[union-attr]


def test_a_restore_evicts_idle_caches_until_its_tokens_fit() -> None:
    h = harness()
    h.add(list(range(200, 240)), max_tokens=4)  # 43 cells in one slot
    h.run()
    h.add(list(range(300, 340)), max_tokens=4)  # 43 in the other
    h.run()
    assert h.sched.kv_cells_used == 86
    keep = next(i for i in range(2) if h.sched.cached_tokens(i)[:1] == (300,))
    h.sched.clear_for_restore(keep, 100)
    apply(h.runner.kv, h.sched.take_memory_ops())
    assert h.sched.kv_cells_used == 0 == h.runner.kv.used  # the other (idle) cache made room


def test_a_request_with_a_slot_runs_in_it_and_says_so() -> None:
    h = harness()
    for slot in (1, 0, 1):  # each its slot, whatever the pool would pick (prefix, LRU)
        rid = h.add(PROMPT, max_tokens=4, slot=slot)
        h.run()
        assert h.final(rid).slot == slot
        assert h.sched.cached_tokens(slot)[: len(PROMPT)] == tuple(PROMPT)
    anywhere = h.add(PROMPT, max_tokens=4)
    h.run()
    assert h.final(anywhere).slot in (0, 1)  # the slot it ended in, also when none was asked for


def test_a_request_waits_for_its_busy_slot_and_an_unknown_slot_is_refused() -> None:
    h = harness()
    first = h.add(PROMPT, max_tokens=8, slot=0)
    h.step()
    second = h.add([7, *PROMPT], max_tokens=2, slot=0)
    third = h.add([8, *PROMPT], max_tokens=2)  # behind it, free to go: it is not held up
    h.step()  # slot 1 is free, yet the second waits for slot 0; the third takes slot 1
    assert h.sched.slots_busy == 2 and not h.events[second]
    h.run()
    assert h.final(first).slot == h.final(second).slot == 0 and h.final(third).slot == 1
    with pytest.raises(RequestRejected):
        h.add(PROMPT, slot=2)


def test_a_request_that_asks_for_progress_hears_of_each_prompt_chunk() -> None:
    h = harness()  # 16 tokens a step: the 30-token prompt is read in two chunks
    rid = h.add(PROMPT, max_tokens=2, progress=True)
    quiet = h.add([9, *PROMPT], max_tokens=2)
    h.run()
    read = [e.progress for e in h.events[rid] if e.progress is not None]
    assert [(p.total, p.cache, p.processed) for p in read] == [(30, 0, 16), (30, 0, 30)]
    assert all(e.progress is None for e in h.events[quiet])
    first = next(e for e in h.events[rid] if e.token_ids)  # the last chunk's progress rides on it
    assert first.progress is read[-1] and h.events[rid][0].progress is read[0]
