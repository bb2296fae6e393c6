"""`--prefill-budget auto` on real llama.cpp (the tiny model): the engine measures its step times at
start, runs with a budget the rule allows, says so, and the measurement leaves nothing behind.

Never a timing assertion: the machine may be fast, slow or busy; only bounds and structure."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams
from outpost.scheduler.budget import ATTENTION_TILE, FALLBACK_BUDGET, MIN_BUDGET
from outpost.scheduler.budget import Asked as BudgetAsked
from outpost.serving.assembly import Engine
from outpost.serving.local_backend import LocalBackend

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def _config(tiny_model: Path, slots: int = 4) -> EngineConfig:
    return EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_seq_max=slots, n_batch=256)


def _answer(engine: Engine, prompt: list[int]) -> list[int]:
    events = list(engine.client.generate_sync(GenerateRequest(prompt, max_tokens=8, sampling=GREEDY)))
    return [t for e in events for t in e.token_ids]


def test_auto_measures_at_start_and_runs_with_a_budget_within_bounds(tiny_model: Path) -> None:
    prompt = list(range(10, 110))  # longer than the 64-token chunk the measurement wrote to seq 0
    with Engine(_config(tiny_model)) as engine:
        budget = engine.prefill_budget
        times = budget.times
        assert budget.source in ("measured", "fallback") and times is not None
        assert ATTENTION_TILE <= (budget.tokens or 0) <= 256, "the tile at least"
        assert engine.scheduler_config.prefill_budget == budget.tokens
        assert math.isfinite(times.decode_s) and times.decode_s > 0
        assert [n for n, _ in times.chunks] == [16, 64]
        if budget.source == "fallback":  # only where this machine was too busy to believe
            assert budget.tokens == FALLBACK_BUDGET
        else:
            assert times.per_token_s > 0
        backend = LocalBackend(engine)
        assert backend.stats().extra == {"prefill_budget": budget.tokens}
        assert f"prefill budget {budget.tokens} tokens/step while decoding" in backend.describe()["serving"]
        measured_answer = _answer(engine, prompt)
    no_fa = _config(tiny_model).model_copy(update={"flash_attn": "off"})
    with Engine(no_fa) as engine:
        assert MIN_BUDGET <= (engine.prefill_budget.tokens or 0) <= 256
    with Engine(_config(tiny_model), prefill_budget="off") as plain:
        assert plain.prefill_budget.tokens is None and plain.scheduler_config.prefill_budget is None
        assert plain.prefill_budget.times is None, "off measures nothing"
        # The measured engine's cache held nothing of its own steps: the same answer, in slot 0.
        assert _answer(plain, prompt) == measured_answer


@pytest.mark.parametrize(
    ("asked", "slots", "tokens", "source"),
    [(24, 4, 24, "explicit"), (None, 4, None, "off"), ("auto", 1, None, "single-slot")],
)
def test_what_is_not_auto_is_taken_as_given(
    tiny_model: Path, asked: BudgetAsked | None, slots: int, tokens: int | None, source: str
) -> None:
    with Engine(_config(tiny_model, slots), prefill_budget=asked) as engine:
        assert engine.prefill_budget.tokens == tokens and engine.prefill_budget.source == source
        assert engine.prefill_budget.times is None
        assert engine.scheduler_config.prefill_budget == tokens
