"""Prompts read one after another, and prompt waves (scheduler/prefill.py), with no model: the fake
runner and the scheduler's own step count, so nothing here follows the machine's speed."""

from __future__ import annotations

import pytest
from fake_runner import reference_tokens
from sched_harness import Harness

from outpost.messages import GenerateRequest
from outpost.scheduler import SchedulerConfig
from outpost.scheduler.prefill import PROMPT_WAVE_HOLD, PROMPT_WAVE_MIN, _waits_for_wave
from outpost.scheduler.request import RequestState
from outpost.scheduler.textstream import TextStream


def prompt(n: int, base: int = 100) -> list[int]:
    return list(range(base, base + n))


def config(**kw: object) -> SchedulerConfig:
    base: dict[str, object] = dict(n_slots=4, n_ctx=2048, n_ctx_seq=512, step_token_budget=128)
    base.update(prefill_budget=8, serial_prompts=True)
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


def first_chunk_step(h: Harness, first_token: int) -> int:
    """The step (0-based) that read the prompt beginning with `first_token`."""
    steps = enumerate(h.runner.steps)
    return next(i for i, out in steps for c in out.chunks if c.start_pos == 0 and c.tokens[0] == first_token)


def test_short_prompts_that_arrive_together_are_read_one_per_step() -> None:
    """Four 20-token prompts at an idle engine with a prefill budget of 8, serial prompts: one whole
    prompt a step, so the first tokens come one step apart, in arrival order; not serial (a GPU's
    setting), all in one step."""
    h = Harness(config())
    rids = [h.add(prompt(20, base=100 + 50 * i), max_tokens=6) for i in range(4)]
    h.run()
    assert [h.first_event_step[r] for r in rids] == [0, 1, 2, 3]
    for i, rid in enumerate(rids):
        assert h.token_ids(rid) == reference_tokens(prompt(20, base=100 + 50 * i), 6)
    together = Harness(config(serial_prompts=False))
    rids = [together.add(prompt(20, base=100 + 50 * i), max_tokens=6) for i in range(4)]
    together.run()
    assert [together.first_event_step[r] for r in rids] == [0, 0, 0, 0]


def test_a_long_prompt_alone_still_takes_the_whole_step() -> None:
    h = Harness(config())
    h.add(prompt(300), max_tokens=2)
    h.add(prompt(20, base=1000), max_tokens=2)
    h.step()
    assert h.runner.steps[0].num_tokens == 128, "the first prompt takes the room; the second waits"


@pytest.mark.parametrize("waves", [0, 4])
def test_a_prompt_waits_for_streams_about_to_end(waves: int) -> None:
    """Four streams with 3 tokens left: with prompt waves of 4 steps, a new prompt is first read in
    the step after their last tokens, beside no stream; with waves off, at once."""
    h = Harness(config(n_slots=8, prompt_waves=waves, prefill_budget=None))
    ending = [h.add(prompt(10, base=100 + 20 * i), max_tokens=6) for i in range(PROMPT_WAVE_MIN)]
    for _ in range(4):  # their prompt step and three tokens: three left
        h.step()
    newcomer = h.add(prompt(20, base=1000), max_tokens=3)
    arrived = h.n_steps
    h.run()
    steps = enumerate(h.runner.steps)
    last_of_ending = max(i for i, out in steps for c in out.chunks if c.seq_id < PROMPT_WAVE_MIN)
    if waves:
        assert first_chunk_step(h, 1000) == last_of_ending + 1
        assert all(c.seq_id == PROMPT_WAVE_MIN for c in h.runner.steps[first_chunk_step(h, 1000)].chunks)
    else:
        assert first_chunk_step(h, 1000) == arrived
    for i, rid in enumerate(ending):
        assert h.token_ids(rid) == reference_tokens(prompt(10, base=100 + 20 * i), 6)
    assert h.token_ids(newcomer) == reference_tokens(prompt(20, base=1000), 3)


def test_fewer_streams_about_to_end_than_a_wave_hold_nothing() -> None:
    """Three streams with 3 tokens left (all that generate, as in a closed loop of four clients):
    fewer than PROMPT_WAVE_MIN, so a new prompt is read at once, beside them."""
    h = Harness(config(n_slots=8, prompt_waves=4, prefill_budget=None))
    for i in range(PROMPT_WAVE_MIN - 1):
        h.add(prompt(10, base=100 + 20 * i), max_tokens=6)
    for _ in range(4):
        h.step()
    h.add(prompt(20, base=1000), max_tokens=3)
    arrived = h.n_steps
    h.run()
    assert first_chunk_step(h, 1000) == arrived
    assert len(h.runner.steps[arrived].chunks) == PROMPT_WAVE_MIN, "the prompt beside the three streams"


def test_no_wait_for_a_stream_far_from_its_end() -> None:
    h = Harness(config(prompt_waves=4))
    h.add(prompt(10), max_tokens=100)
    h.step()
    h.add(prompt(20, base=1000), max_tokens=3)
    arrived = h.n_steps
    h.run()
    assert first_chunk_step(h, 1000) == arrived


def test_one_stream_of_many_about_to_end_is_no_wave() -> None:
    """Eight streams, one (or three) of them 3 tokens from their end: waves of 4 steps wait for a
    quarter of them and PROMPT_WAVE_MIN at least (four), so a new prompt is read at once; with four
    of them about to end, it waits until they have."""
    for n_ending, waits in ((1, False), (3, False), (4, True)):
        h = Harness(config(n_slots=16, prompt_waves=4, step_token_budget=256, prefill_budget=None))
        for i in range(8):  # all read in the first step
            h.add(prompt(4, base=100 + 10 * i), max_tokens=6 if i < n_ending else 60)
        for _ in range(3):  # the prompt step and two tokens: the short ones have three left
            h.step()
        arrived = h.n_steps
        newcomer = h.add(prompt(20, base=2000), max_tokens=2)
        h.run()
        read_at = first_chunk_step(h, 2000)
        short_ends = max(i for i, out in enumerate(h.runner.steps) for c in out.chunks if c.seq_id == 0)
        assert read_at == (short_ends + 1 if waits else arrived), (n_ending, read_at, arrived)
        assert h.token_ids(newcomer) == reference_tokens(prompt(20, base=2000), 2)


def test_a_wave_wait_is_bounded() -> None:
    """However long a wave keeps coming, a prompt not yet started waits at most PROMPT_WAVE_HOLD x
    prompt_waves steps; one already started (a long prompt read in chunks) never waits."""
    waves = 3
    cfg = config(prompt_waves=waves)
    req = GenerateRequest(prompt_tokens=[1, 2], max_tokens=4)
    state = RequestState(req=req, tokens=[1, 2], text=TextStream(), budget=4)
    assert [_waits_for_wave(state, cfg) for _ in range(PROMPT_WAVE_HOLD * waves + 2)] == [True] * (
        PROMPT_WAVE_HOLD * waves
    ) + [False, False]
    started = RequestState(req=req, tokens=[1, 2], text=TextStream(), budget=4, scheduled_at=0.0)
    assert not _waits_for_wave(started, cfg)


def test_prompt_waves_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="prompt_waves"):
        SchedulerConfig(prompt_waves=-1)
