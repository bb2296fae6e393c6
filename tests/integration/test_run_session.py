"""`outpost run`'s conversation (outpost/run.py ChatSession) on real llama.cpp with the tiny model: an
answer that loops stops at the repeat guard, and one that does not runs to its limit untouched.

The loop is forced by a logit bias that leaves the model one token to choose, so it is the same loop
on every CPU whatever the kernels' rounding."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from outpost.engine.config import EngineConfig
from outpost.messages import SamplingParams
from outpost.run import ChatSession, RepeatGuard
from outpost.serving.assembly import Engine


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[Engine]:
    with Engine(EngineConfig(model_path=str(tiny_model), n_ctx=1024, n_seq_max=1), max_queue=1) as e:
        yield e


def _only(engine: Engine, token: int) -> SamplingParams:
    """Greedy, every token but `token` banned (the end of generation too)."""
    banned = tuple((t, float("-inf")) for t in range(engine.vocab.n_tokens) if t != token)
    return SamplingParams(temperature=0.0, logit_bias=banned)


def _session(engine: Engine, sampling: SamplingParams, stop_on_loop: bool) -> ChatSession:
    return ChatSession(engine, sampling, 256, stop_on_loop=stop_on_loop, out=io.StringIO(), err=io.StringIO())


def test_an_answer_stuck_on_one_token_stops_at_the_repeat_guard(engine: Engine) -> None:
    (token,) = engine.tokenize_prompt(" the", add_special=False)
    piece = engine.vocab.token_to_piece(token).decode()
    session = _session(engine, _only(engine, token), stop_on_loop=True)
    answer = session.ask("Say one word again and again.")
    assert session.last_looped
    # The guard trips on the token that makes the run MIN_SPAN long; nothing after it is shown.
    assert answer == piece * RepeatGuard.MIN_SPAN
    assert session.out.getvalue() == answer + "\n"  # type: ignore[attr-defined]
    assert "the answer repeats itself: stopped" in session.err.getvalue()  # type: ignore[attr-defined]
    assert session.last_timings.predicted_n >= RepeatGuard.MIN_SPAN  # the timings still come
    assert session.messages[-1] == {"role": "assistant", "content": answer}


def test_without_the_guard_the_same_loop_runs_to_its_limit(engine: Engine) -> None:
    (token,) = engine.tokenize_prompt(" the", add_special=False)
    session = _session(engine, _only(engine, token), stop_on_loop=False)
    answer = session.ask("Say one word again and again.")
    assert not session.last_looped
    assert session.last_timings.predicted_n == 256
    assert answer == engine.vocab.token_to_piece(token).decode() * 256
