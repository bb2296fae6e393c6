"""LoRA settings in the scheduler: a step decodes one group of settings, the groups take turns, and
a cached prefix is reused only by a request with the settings it was computed under.

No model: the fake runner checks KV bookkeeping; the tests read each step's `SchedulerOutput`.
"""

from __future__ import annotations

import itertools

from fake_runner import reference_tokens
from sched_harness import Harness

from outpost.messages import LoraScales, lora_settings
from outpost.scheduler import SchedulerConfig
from outpost.scheduler.output import SchedulerOutput

A: LoraScales = ((0, 1.0),)
B: LoraScales = ((0, 0.5),)
C: LoraScales = ((0, 1.0), (1, 2.0))
PROMPT = list(range(10, 40))


def config(n_slots: int = 6, budget: int = 512, **kwargs: object) -> SchedulerConfig:
    return SchedulerConfig(
        n_slots=n_slots,
        n_ctx=512 * n_slots,
        n_ctx_seq=512,
        step_token_budget=budget,
        **kwargs,  # type: ignore[arg-type]
    )


def watched(h: Harness) -> list[tuple[LoraScales, set[LoraScales]]]:
    """Per decoded step: its settings, and those of the requests with a chunk in it (read as the
    runner gets the step, before the requests that finish in it leave)."""
    seen: list[tuple[LoraScales, set[LoraScales]]] = []
    prepare = h.runner.prepare

    def spy(out: SchedulerOutput) -> None:
        owners = [h.sched._owner[chunk.seq_id] for chunk in out.chunks]
        if out.chunks:
            seen.append((out.lora, {s.lora for s in owners if s is not None}))
        prepare(out)

    h.runner.prepare = spy  # type: ignore[method-assign]
    return seen


def test_settings_normal_form() -> None:
    assert lora_settings([(1, 0.5), (0, 1.0), (1, 2.0), (2, 0.0)]) == ((0, 1.0), (1, 2.0))
    assert lora_settings([]) == ()


def test_same_settings_batch_together() -> None:
    h = Harness(config())
    for i in range(4):
        h.add([i + 1, *PROMPT], 6, lora=A)
    h.step()
    assert len(h.runner.steps[0].chunks) == 4 and h.runner.steps[0].lora == A
    h.run()
    assert all(len(out.chunks) == 4 and out.lora == A for out in h.runner.steps if out.chunks)


def test_different_settings_never_share_a_step_and_take_turns() -> None:
    h = Harness(config())
    groups = [(), A, B, C]
    ids = [h.add([i + 1, *PROMPT], 12, lora=groups[i % 4]) for i in range(8)]
    seen = watched(h)
    h.run()
    served = []
    for lora, owners in seen:
        assert owners == {lora}, "a step mixed LoRA settings"
        served.append(lora)
    # Fairness: while all four groups run, each is served once in every 4 consecutive steps.
    while_all = served[: 4 * 12]
    for start in range(0, len(while_all) - 3):
        assert set(while_all[start : start + 4]) == set(groups)
    # Same outputs as alone: turns change when tokens come, never which.
    for i, rid in enumerate(ids):
        assert h.token_ids(rid) == reference_tokens([i + 1, *PROMPT], 12)


def test_no_starvation_by_a_busy_group() -> None:
    """One request under B among many under A still gets a step every other step."""
    h = Harness(config(n_slots=8))
    for i in range(7):
        h.add([i + 1, *PROMPT], 40, lora=A)
    lone = h.add([50, *PROMPT], 10, lora=B)
    h.run()
    steps_with_b = [n for n, out in enumerate(h.runner.steps) if out.lora == B and out.chunks]
    assert len(steps_with_b) == 10  # its prompt and 9 decode steps, then it is done
    gaps = [b - a for a, b in itertools.pairwise(steps_with_b)]
    assert max(gaps) <= 2
    assert h.token_ids(lone) == reference_tokens([50, *PROMPT], 10)


def test_prefix_reused_only_under_equal_settings() -> None:
    h = Harness(config(n_slots=2))
    first = h.add([*PROMPT, 1], 4, lora=A)
    h.run()
    assert h.final(first).timings is not None
    same = h.add([*PROMPT, 2], 4, lora=A)
    h.run()
    timings = h.final(same).timings
    assert timings is not None and timings.cache_n == len(PROMPT)
    other = h.add([*PROMPT, 3], 4, lora=B)
    h.run()
    timings = h.final(other).timings
    assert timings is not None and timings.cache_n == 0
    plain = h.add([*PROMPT, 4], 4)
    h.run()
    timings = h.final(plain).timings
    assert timings is not None and timings.cache_n == 0


def test_prefix_being_computed_is_not_awaited_across_settings() -> None:
    """Two cold requests sharing a prefix under different settings each compute it."""
    h = Harness(config(n_slots=2))
    h.add([*PROMPT, 1], 2, lora=A)
    h.add([*PROMPT, 2], 2, lora=B)
    h.step()
    assert not any(s.awaiting for s in h.sched._running)
    h.run()
    for out in h.runner.steps:
        assert not any(op for op in out.memory_ops if type(op).__name__ == "SeqCopy")


def test_a_slot_keeps_the_settings_of_what_it_holds() -> None:
    h = Harness(config(n_slots=1))
    h.add(PROMPT, 3, lora=C)
    h.run()
    assert h.sched._pool.slots[0].lora == C
    h.add(PROMPT, 3)
    h.step()
    assert h.sched._pool.slots[0].lora == ()
    h.run()
