"""GBNF for `type: number` within bounds: `minimum`/`maximum` (and their exclusive forms) on decimals.

llama.cpp's converters bound integers only; a number's bounds were ignored, so `maximum: 1.5` could
come back as 1e300. This rule is sound rather than complete: every string it admits is in range,
written as an integer or as `int.frac` (no exponent), where the fraction cannot carry the value
past a bound:
- a whole number n, for the integers in range (`intrange`);
- `i.ddd` with i >= 0, when all of [i, i+1) is in range;
- `-k.ddd` with k >= 0, when all of (-(k+1), -k] is in range.
A range too narrow for any of those (e.g. 0.2..0.8) is refused with a ValueError (a 400), never
silently left unbounded.
"""

from __future__ import annotations

import math
from typing import Any

from outpost.grammar.intrange import INT64_MAX, INT64_MIN, min_max_int_rule

FRACTION = '"." [0-9]{1,15}'


def _bound(schema: dict[str, Any], inclusive: str, exclusive: str) -> tuple[float, bool] | None:
    for key, is_exclusive in ((inclusive, False), (exclusive, True)):
        if key in schema:
            value = schema[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise ValueError(f"number bounds must be finite numbers, got {key}={value!r}")
            return float(value), is_exclusive
    return None


def _clamp(value: float) -> int:
    return int(max(INT64_MIN, min(INT64_MAX, value)))


def number_bounds_rule(schema: dict[str, Any]) -> str | None:
    """A GBNF expression for the bounded numbers of `schema`, or None when it has no bounds."""
    low = _bound(schema, "minimum", "exclusiveMinimum")
    high = _bound(schema, "maximum", "exclusiveMaximum")
    if low is None and high is None:
        return None
    lo, lo_excl = low if low is not None else (-math.inf, False)
    hi, hi_excl = high if high is not None else (math.inf, False)
    # The first/last integers that satisfy each bound.
    first = math.floor(lo) + 1 if lo_excl else math.ceil(lo) if math.isfinite(lo) else INT64_MIN
    last = math.ceil(hi) - 1 if hi_excl else math.floor(hi) if math.isfinite(hi) else INT64_MAX
    alternatives: list[str] = []
    if first <= last:
        alternatives.append(min_max_int_rule(_clamp(first), _clamp(last)))
    # i.ddd covers [i, i+1): i itself must satisfy the lower bound, i+1 <= hi.
    pos_lo = max(0, first)
    pos_hi = math.floor(hi) - 1 if math.isfinite(hi) else INT64_MAX
    if pos_lo <= pos_hi:
        alternatives.append(f"({min_max_int_rule(_clamp(pos_lo), _clamp(pos_hi))}) {FRACTION}")
    # -k.ddd covers (-(k+1), -k]: -k must satisfy the upper bound, -(k+1) >= lo.
    neg_lo = max(0, -last)
    neg_hi = math.floor(-lo) - 1 if math.isfinite(lo) else INT64_MAX
    if neg_lo <= neg_hi:
        alternatives.append(f'"-" ({min_max_int_rule(_clamp(neg_lo), _clamp(neg_hi))}) {FRACTION}')
    if not alternatives:
        raise ValueError(
            f"number bounds {lo:g}..{hi:g} are too narrow for the output grammar: "
            "widen them to span a whole number"
        )
    return " | ".join(f"({a})" for a in alternatives)
