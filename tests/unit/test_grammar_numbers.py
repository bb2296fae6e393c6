"""`type: number` bounds: every string the rule admits is in range; typical in-range values are admitted."""

from __future__ import annotations

import itertools
import re
from decimal import Decimal

import pytest

from outpost.grammar import json_schema_to_grammar
from outpost.grammar.numrange import number_bounds_rule


def _as_regex(expr: str) -> re.Pattern[str]:
    out = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), expr).replace(" ", "")
    return re.compile(out)


def _candidates() -> list[str]:
    ints = [str(n) for n in range(-30, 31)]
    fracs = [f"{i}.{f}" for i, f in itertools.product(range(-12, 13), ("0", "25", "5", "75", "999"))]
    fracs += [f"-0.{f}" for f in ("0", "25", "5", "999")]
    return ints + fracs + ["1e3", "2E-1", "-1e9", "1e300"]


SCHEMAS = [
    {"minimum": 0, "maximum": 1.5},
    {"minimum": -2.5, "maximum": 7},
    {"exclusiveMinimum": 0, "exclusiveMaximum": 3},
    {"minimum": -10, "maximum": -0.5},
    {"maximum": 2.25},
    {"minimum": 3.5},
    {"exclusiveMinimum": -4.0},
    {"minimum": 1, "maximum": 1},
]


def _in_range(text: str, schema: dict[str, float]) -> bool:
    v = Decimal(text)
    return (
        ("minimum" not in schema or v >= Decimal(str(schema["minimum"])))
        and ("maximum" not in schema or v <= Decimal(str(schema["maximum"])))
        and ("exclusiveMinimum" not in schema or v > Decimal(str(schema["exclusiveMinimum"])))
        and ("exclusiveMaximum" not in schema or v < Decimal(str(schema["exclusiveMaximum"])))
    )


@pytest.mark.parametrize("bounds", SCHEMAS)
def test_every_admitted_number_is_in_range(bounds: dict[str, float]) -> None:
    rule = number_bounds_rule({"type": "number", **bounds})
    assert rule is not None
    pattern = _as_regex(rule)
    admitted = [c for c in _candidates() if pattern.fullmatch(c)]
    assert admitted, bounds
    assert all(_in_range(c, bounds) for c in admitted), [c for c in admitted if not _in_range(c, bounds)]
    # no exponents: 1e300 can never come back for a bounded number
    assert not any("e" in c.lower() for c in admitted)


def test_whole_numbers_in_range_and_inner_decimals_are_admitted() -> None:
    pattern = _as_regex(number_bounds_rule({"minimum": -2.5, "maximum": 7}) or "")
    for text in ["-2", "0", "7", "3.75", "0.5", "-0.5", "-1.999", "6.999"]:
        assert pattern.fullmatch(text), text
    for text in ["8", "7.5", "-3", "-2.75", "1e1"]:
        assert not pattern.fullmatch(text), text


def test_unbounded_numbers_keep_the_plain_rule_and_narrow_ranges_are_refused() -> None:
    assert number_bounds_rule({"type": "number"}) is None
    with pytest.raises(ValueError, match="too narrow"):
        number_bounds_rule({"minimum": 0.2, "maximum": 0.8})
    with pytest.raises(ValueError, match="finite"):
        number_bounds_rule({"maximum": "7"})


def test_schema_grammar_uses_the_bounded_rule() -> None:
    schema = {"type": "object", "properties": {"p": {"type": "number", "maximum": 1.5, "minimum": 0}}}
    gbnf = json_schema_to_grammar({**schema, "required": ["p"]})
    assert 'doc-p ::= (([0-1]) | (("0") "." [0-9]{1,15})) space' in gbnf.splitlines()
