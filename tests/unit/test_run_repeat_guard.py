"""`outpost run`'s repeat guard (outpost/run.py RepeatGuard): which token streams count as a loop."""

from __future__ import annotations

import random

import pytest

from outpost.run import PRESETS, RepeatGuard


def _first_trip(tokens: list[int]) -> int | None:
    """The number of tokens after which the guard first says the stream loops (fed one at a time)."""
    guard = RepeatGuard()
    return next((i + 1 for i, t in enumerate(tokens) if guard.add([t])), None)


def test_two_tokens_said_over_and_over_trip_it_once_they_span_min_span() -> None:
    summary = list(range(100, 140))  # 40 distinct tokens, then ", 2019" forever
    loop = [11, 2019] * 200
    assert _first_trip(summary + loop) == len(summary) + RepeatGuard.MIN_SPAN


def test_one_sentence_said_three_times_trips_it_twice_does_not() -> None:
    sentence = list(range(500, 530))  # 30 tokens: three copies span 90 >= MIN_SPAN
    assert _first_trip([1, 2, 3] + sentence * 2) is None
    assert _first_trip([1, 2, 3] + sentence * 3) == 3 + 3 * len(sentence)


def test_a_block_longer_than_max_period_is_not_looked_for() -> None:
    block = list(range(1000, 1000 + RepeatGuard.MAX_PERIOD + 1))
    assert _first_trip(block * 4) is None


def test_text_that_repeats_words_but_not_itself_never_trips_it() -> None:
    rng = random.Random(0)
    words = [rng.randrange(50) for _ in range(2000)]  # a small vocabulary: many short repeats
    assert _first_trip(words) is None
    assert _first_trip([7] * (RepeatGuard.MIN_SPAN - 1)) is None  # a short run of one token is no loop


def test_tokens_given_in_steps_count_as_given_one_by_one() -> None:
    stream = list(range(20)) + [5, 6, 7] * 40
    guard = RepeatGuard()
    chunks = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    tripped_at = next(len(guard.tokens) for chunk in chunks if guard.add(chunk))
    one_by_one = _first_trip(stream)
    assert one_by_one is not None and tripped_at == -(-one_by_one // 7) * 7  # the chunk that holds it


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_presets_users_run_stop_a_loop(name: str) -> None:
    assert PRESETS[name].stop_on_loop
