"""The engine benchmark's round-by-round arithmetic: medians over rounds, and 8 sequences over
each single stream they are divided by."""

from __future__ import annotations

import statistics
from typing import Any


def ratios_to_single(ours: list[dict[str, float]], single_rounds: list[dict[str, float]]) -> dict[str, Any]:
    """8 sequences over each single stream, round by round (medians of the rounds' ratios). The
    stream on one slot of the 8 slots' size ("same_cells") gets the plain keys, the ratio's
    target; the others' keys end in their names."""
    results: dict[str, Any] = {}
    for name in single_rounds[0]:
        suffix = "" if name == "same_cells" else f"_{name}"
        singles = [single[name] for single in single_rounds]
        by_round = [rates["8"] / single for rates, single in zip(ours, singles, strict=True)]
        results[f"single_tok_s_in_rounds{suffix}"] = round(statistics.median(singles), 2)
        results[f"single_tok_s_rounds{suffix}"] = [round(x, 1) for x in singles]
        results[f"batched_8_over_single_rounds{suffix}"] = [round(x, 3) for x in by_round]
        results[f"batched_8_over_single{suffix}"] = round(statistics.median(by_round), 3)
    return results


def medians(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}


def rounded(rates: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 1) for k, v in rates.items()}
