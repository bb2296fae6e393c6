"""The prefill budget's rule and spelling (outpost/scheduler/budget.py), on made-up step times."""

from __future__ import annotations

import argparse
import math

import pytest

from outpost.cli import build_parser
from outpost.envflags import use_environment
from outpost.scheduler.budget import (
    ATTENTION_TILE,
    FALLBACK_BUDGET,
    MIN_BUDGET,
    STEP_MULTIPLE,
    PrefillBudget,
    StepTimes,
    budget_floor,
    choose_prefill_budget,
    parse_prefill_budget,
    resolve_prefill_budget,
)
from outpost.settings import EngineSettings

MS = 1e-3


def linear(decode_ms: float, base_ms: float, per_token_ms: float) -> StepTimes:
    """A one-token decode of decode_ms; a chunk of n tokens costs base_ms + n * per_token_ms."""
    return StepTimes(decode_ms * MS, tuple((n, (base_ms + n * per_token_ms) * MS) for n in (16, 64)))


def _parse(argv: list[str], env: dict[str, str]) -> argparse.Namespace:
    parser = build_parser()
    use_environment(parser, argv, env)
    return parser.parse_args(argv)


def never_measure() -> StepTimes:
    raise AssertionError("nothing to measure for this budget")


@pytest.mark.parametrize(
    ("text", "value"),
    [("auto", "auto"), (" AUTO ", "auto"), ("off", "off"), ("Off", "off"), ("0", "off"), ("96", 96)],
)
def test_spelling(text: str, value: object) -> None:
    assert parse_prefill_budget(text) == value


@pytest.mark.parametrize("text", ["-1", "1.5", "none", "", "12 tokens"])
def test_bad_spelling_says_what_is_accepted(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="auto, off, 0 or a number"):
        parse_prefill_budget(text)


def test_serve_defaults_to_auto_and_reads_the_variable() -> None:
    assert EngineSettings.model_fields["prefill_budget"].default == "auto"
    assert _parse(["serve"], {}).prefill_budget is None  # not given: the config's default
    assert _parse(["serve"], {"OUTPOST_PREFILL_BUDGET": "off"}).prefill_budget == "off"
    assert _parse(["serve"], {"OUTPOST_PREFILL_BUDGET": "0"}).prefill_budget == "off"
    assert _parse(["serve", "--prefill-budget", "48"], {"OUTPOST_PREFILL_BUDGET": "off"}).prefill_budget == 48
    assert _parse(["worker", "-m", "x.gguf", "--prefill-budget", "12"], {}).prefill_budget == 12


def test_a_step_with_the_budget_costs_at_most_the_multiple_of_a_decode_step() -> None:
    """decode 20 ms, +1 ms per prompt token: (3 - 1) * 20 / 1 = 40 tokens, the most that fit."""
    times = linear(20, 5, 1.0)
    assert times.per_token_s == pytest.approx(1.0 * MS)
    budget = choose_prefill_budget(times, n_batch=512)
    assert budget == PrefillBudget(40, "measured", times)
    cost = times.decode_s + budget.tokens * times.per_token_s  # type: ignore[operator]
    assert cost <= STEP_MULTIPLE * times.decode_s * (1 + 1e-9)
    assert times.decode_s + (budget.tokens + 1) * times.per_token_s > STEP_MULTIPLE * times.decode_s  # type: ignore[operator]


def test_the_budget_grows_with_the_decode_step_and_shrinks_with_the_prompt_token_cost() -> None:
    base = choose_prefill_budget(linear(20, 20, 1.0), 512).tokens
    assert choose_prefill_budget(linear(40, 40, 1.0), 512).tokens == 2 * base  # type: ignore[operator]
    assert choose_prefill_budget(linear(20, 20, 2.0), 512).tokens == base // 2  # type: ignore[operator]
    assert choose_prefill_budget(linear(20, 20, 1.0), 512, multiple=2.0).tokens == base // 2  # type: ignore[operator]


def test_the_slope_is_a_least_squares_fit_over_every_chunk() -> None:
    times = StepTimes(0.01, ((16, 0.040), (32, 0.080), (64, 0.130)))
    # Not the two extremes' slope (1.875 ms) nor the first two's (2.5 ms).
    assert times.per_token_s == pytest.approx(0.0018304, rel=1e-3)


def test_cheap_prompt_tokens_mean_whole_steps() -> None:
    """A GPU (or a model whose chunks cost little next to a decode step) gets all of n_batch."""
    assert choose_prefill_budget(linear(20, 21, 0.001), n_batch=512).tokens == 512
    assert choose_prefill_budget(linear(20, 21, 1e-9), n_batch=256).tokens == 256


def test_dear_prompt_tokens_still_get_the_minimum() -> None:
    """One token per micro-batch: a prompt token costs about a decode step; the rule alone gives
    2, the floor keeps a long prompt moving."""
    budget = choose_prefill_budget(linear(20, 0, 20), n_batch=512)
    assert budget.tokens == MIN_BUDGET and budget.source == "measured"
    assert choose_prefill_budget(linear(20, 0, 20), n_batch=4).tokens == 4, "never more than n_batch"


def test_with_flash_attention_the_floor_is_the_attention_tile() -> None:
    """Below 64 tokens a micro-batch attends one query row at a time: a rule that says 40 gets 64;
    a rule above the tile keeps its own number."""
    assert budget_floor(n_ubatch=512, flash_attn=True) == ATTENTION_TILE == 64
    assert budget_floor(n_ubatch=512, flash_attn=False) == ATTENTION_TILE  # a step reads all weights
    assert budget_floor(n_ubatch=1, flash_attn=True) == MIN_BUDGET, "one token per micro-batch: no tile"
    tile = budget_floor(512, True)
    assert choose_prefill_budget(linear(20, 20, 1.0), 512, tile).tokens == 64
    assert choose_prefill_budget(linear(20, 21, 0.1), 512, tile).tokens == 400
    assert choose_prefill_budget(linear(20, 20, 1.0), 48, tile).tokens == 48, "never more than n_batch"


@pytest.mark.parametrize(
    "times",
    [
        StepTimes(0.02, ((16, 0.05), (64, 0.04))),  # the bigger chunk was faster
        StepTimes(0.02, ((16, 0.05), (64, 0.05))),  # no slope at all
        StepTimes(0.06, ((16, 0.05), (64, 0.10))),  # one token slower than sixteen
        StepTimes(0.0, ((16, 0.05), (64, 0.10))),
        StepTimes(-0.01, ((16, 0.05), (64, 0.10))),
        StepTimes(math.nan, ((16, 0.05), (64, 0.10))),
        StepTimes(0.02, ((16, 0.05), (64, math.inf))),  # a step that failed
        StepTimes(0.02, ((16, 0.05),)),  # n_batch left room for one chunk size only
        StepTimes(0.02, ()),
    ],
)
def test_unbelievable_measurements_fall_back_to_the_constant(times: StepTimes) -> None:
    assert not times.believable()
    budget = choose_prefill_budget(times, n_batch=512)
    assert budget.tokens == FALLBACK_BUDGET and budget.source == "fallback"
    assert choose_prefill_budget(times, n_batch=16).tokens == 16
    assert "not believable" in budget.describe()


def test_only_auto_with_slots_to_share_measures() -> None:
    assert resolve_prefill_budget(None, 8, 512, 64, never_measure) == PrefillBudget(None, "off")
    assert resolve_prefill_budget("off", 8, 512, 64, never_measure) == PrefillBudget(None, "off")
    assert resolve_prefill_budget(16, 8, 512, 64, never_measure) == PrefillBudget(16, "explicit")
    assert resolve_prefill_budget("auto", 1, 512, 64, never_measure) == PrefillBudget(None, "single-slot")
    calls: list[int] = []

    def measure() -> StepTimes:
        calls.append(1)
        return linear(20, 5, 1.0)

    assert resolve_prefill_budget("auto", 8, 512, 8, measure).tokens == 40 and len(calls) == 1
    assert resolve_prefill_budget("auto", 8, 512, 64, measure).tokens == 64 and len(calls) == 2


def test_descriptions_say_the_budget_and_where_it_came_from() -> None:
    measured = choose_prefill_budget(linear(24, 24, 1.1), 512)
    assert measured.describe() == (
        "prefill budget 43 tokens/step while decoding (measured: decode 24 ms, +1.1 ms/prompt token)"
    )
    explicit = PrefillBudget(96, "explicit")
    assert explicit.describe() == "prefill budget 96 tokens/step while decoding (explicit)"
    assert PrefillBudget(None, "off").describe() == "prefill budget: none (off)"
    assert PrefillBudget(None, "single-slot").describe() == "prefill budget: none (no other slot)"
