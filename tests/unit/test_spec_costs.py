"""Speculation's prices as the engine sets them at start (outpost/serving/assembly.py `_spec_costs`), from
step times faked here: what the ready line says, and what stands where a time is not believable."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from outpost.scheduler.budget import PrefillBudget, StepTimes
from outpost.scheduler.config import SchedulerConfig
from outpost.serving.assembly import UNMEASURED_READ_SHARE, _spec_costs

TARGET = StepTimes(0.020, ((16, 0.050), (64, 0.146)))  # 20 ms a step, +2 ms a prompt token
DRAFT = StepTimes(0.010, ((16, 0.074), (64, 0.266)))  # 10 ms a step, +4 ms a token read
NOISY = StepTimes(0.010, ((16, 0.300), (64, 0.100)))  # the bigger chunk faster: a busy machine


@dataclass
class FakeDraft:
    answers: list[StepTimes]
    asked: int = 0
    step_at_depth: float = 0.010

    def measure_step_times(self) -> StepTimes:
        self.asked += 1
        return self.answers[min(self.asked, len(self.answers)) - 1]

    def measure_step_at_depth(self) -> float:
        return self.step_at_depth


@dataclass
class FakeRunner:
    draft_model: FakeDraft | None = None
    times: list[StepTimes] = field(default_factory=lambda: [TARGET])
    # A step and a verification of 8 draft tokens at depth: +2 ms a draft token, as TARGET's chunks.
    verify: tuple[float, float] = (0.020, 0.036)

    def measure_step_times(self) -> StepTimes:
        return self.times[0]

    def measure_verify_times(self) -> tuple[float, float]:
        return self.verify


def costs(runner: FakeRunner, enabled: bool = True) -> Any:
    return _spec_costs(cast(Any, runner), PrefillBudget(64, "measured", TARGET), enabled)


def test_measured_prices_are_relative_to_a_target_step_and_said() -> None:
    c = costs(FakeRunner(FakeDraft([DRAFT])))
    assert (c.token, c.draft, c.read) == pytest.approx((0.1, 0.5, 0.2))
    assert c.describe() == (
        "speculation: a draft token 0.10 of a step, "
        "the draft model 0.50 a step and 0.200 a token read (measured)"
    )


def test_a_noisy_draft_measurement_is_taken_again() -> None:
    draft = FakeDraft([NOISY, NOISY, DRAFT])
    c = costs(FakeRunner(draft))
    assert draft.asked == 3 and c.read == pytest.approx(0.2) and c.source == "measured"


def test_a_read_never_timed_is_priced_dear_and_said_so() -> None:
    """A default read cost far under the real one made a draft model read 1,000-token prompts
    it could never repay; unmeasured, a token read costs a share of the measured draft step."""
    draft = FakeDraft([NOISY])
    c = costs(FakeRunner(draft))
    assert draft.asked == 3
    assert c.read == pytest.approx(max(SchedulerConfig().draft_read_cost, 0.5 * UNMEASURED_READ_SHARE))
    assert "not believable" in c.describe()


def test_without_speculation_by_default_nothing_is_measured() -> None:
    draft = FakeDraft([DRAFT])
    c = costs(FakeRunner(draft), enabled=False)
    assert draft.asked == 0 and c.source.startswith("defaults")
    n_gram_only = costs(FakeRunner(None))
    assert "draft model" not in n_gram_only.describe() and n_gram_only.token == pytest.approx(0.1)


def test_prices_are_those_of_a_verification_after_a_history() -> None:
    """A verification has logits at every position and attention over a history: dearer per token
    than a prompt chunk at position 0 (f16 135M here: 0.27 of a step against 0.13), and a draft
    model's step at depth dearer relative to the target's. Those prices stand, not the chunks'."""
    runner = FakeRunner(FakeDraft([DRAFT], step_at_depth=0.014), verify=(0.020, 0.068))
    c = costs(runner)
    assert (c.token, c.draft, c.read) == pytest.approx((0.3, 0.7, 0.2))
    assert c.source == "measured"


def test_a_verification_that_cannot_be_timed_falls_back_to_prompt_chunks() -> None:
    c = costs(FakeRunner(FakeDraft([DRAFT], step_at_depth=math.inf), verify=(0.020, math.inf)))
    assert (c.token, c.draft) == pytest.approx((0.1, 0.5))
    assert "priced from prompt chunks" in c.describe()
