"""outpost.grammar: JSON schema -> GBNF honours bounds (checked by matching the rules as regexes)."""

from __future__ import annotations

import re

import pytest

from outpost.grammar import GrammarBuilder, json_schema_to_grammar
from outpost.grammar.intrange import INT64_MAX, INT64_MIN, int_bounds, min_max_int_rule


def _as_regex(expr: str) -> re.Pattern[str]:
    """An integer-range GBNF expression (literals, classes, |, (), {m,n}) as a Python regex."""
    out = re.sub(r'"([^"]*)"', lambda m: re.escape(m.group(1)), expr).replace(" ", "")
    return re.compile(out)


@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, 7), (1, 7), (-5, 123), (-300, -17), (10, 99), (7, 1000), (0, 0), (-1, 1), (95, 2041)],
)
def test_closed_ranges_match_exactly_their_integers(lo: int, hi: int) -> None:
    pattern = _as_regex(min_max_int_rule(lo, hi))
    for n in range(-2500, 2500):
        assert bool(pattern.fullmatch(str(n))) == (lo <= n <= hi), n


@pytest.mark.parametrize("lo", [0, 3, 9, 10, 37, 500])
def test_open_above(lo: int) -> None:
    pattern = _as_regex(min_max_int_rule(lo, INT64_MAX))
    for n in range(-100, 3000):
        assert bool(pattern.fullmatch(str(n))) == (n >= lo), n
    assert pattern.fullmatch("1234567890123456")  # up to 16 digits, as llama.cpp


@pytest.mark.parametrize("hi", [-12, 0, 7, 250])
def test_open_below(hi: int) -> None:
    pattern = _as_regex(min_max_int_rule(INT64_MIN, hi))
    for n in range(-1000, 1000):
        assert bool(pattern.fullmatch(str(n))) == (n <= hi), n
    assert not pattern.fullmatch("0" + str(abs(hi)) if hi > 0 else "00")


def test_bounds_from_schema() -> None:
    assert int_bounds({"type": "integer"}) is None
    assert int_bounds({"maximum": 7}) == (INT64_MIN, 7)
    assert int_bounds({"minimum": 1.5, "maximum": 7.9}) == (2, 7)
    assert int_bounds({"exclusiveMinimum": 0, "exclusiveMaximum": 10}) == (1, 9)
    assert int_bounds({"minimum": -2.5}) == (-2, INT64_MAX)
    with pytest.raises(ValueError, match="empty"):
        int_bounds({"minimum": 5, "maximum": 4})
    with pytest.raises(ValueError, match="numbers"):
        int_bounds({"maximum": "7"})


def test_schema_grammar_keeps_enum_lengths_items_and_integer_bounds() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0, "maximum": 7},
            "unit": {"enum": ["c", "f"]},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
            "name": {"type": "string", "minLength": 2, "maxLength": 3},
        },
        "required": ["n", "unit"],
    }
    text = json_schema_to_grammar(schema)
    assert text.startswith("root ::= doc\n")
    rules = dict(line.split(" ::= ", 1) for line in text.splitlines() if " ::= " in line)
    assert rules["doc-n"] == "([0-7]) space"
    assert rules["doc-unit"] == '"\\"c\\"" | "\\"f\\""'
    assert rules["doc-name"] == '"\\"" char{2,3} "\\"" space'
    assert 'doc-n-kv "," space doc-unit-kv' in rules["doc"]  # required keys come first, unconditionally
    assert rules["doc-tags"] == '"[" space string ("," space string)? "]" space'  # 1 or 2 items


def test_bad_schemas_are_value_errors() -> None:
    with pytest.raises(ValueError):
        json_schema_to_grammar("not a schema")
    with pytest.raises(ValueError):
        json_schema_to_grammar({"type": "integer", "minimum": 3, "maximum": 1})
    with pytest.raises(ValueError):
        json_schema_to_grammar({"type": "no-such-type"})
    with pytest.raises(ValueError):
        json_schema_to_grammar({"$ref": "#/definitions/missing"})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 10**9},
        {"type": "array", "items": {"type": "integer"}, "minItems": 5000},
        {"type": "string", "minLength": 3, "maxLength": 2},
        {"type": "string", "maxLength": "7"},
    ],
)
def test_repetition_bounds_llama_cpp_refuses_are_value_errors(schema: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        json_schema_to_grammar(schema)


def test_builder_combines_schemas_under_one_root() -> None:
    b = GrammarBuilder()
    a = b.rule({"type": "integer", "maximum": 3}, "a")
    c = b.rule({"type": "boolean"}, "c")
    text = b.grammar(f"{b.literal('<x>')} ({a} | {c})")
    assert (a, c) == ("a", "boolean")  # primitives keep their own rule names
    assert text.splitlines()[0] == 'root ::= "<x>" (a | boolean)'
    assert '\na ::= ("-" [1-9] [0-9]{0,15} | [0-3]) space\n' in text


def test_gbnf_check_accepts_llama_cpp_grammars_and_names_the_problem() -> None:
    import re

    import pytest

    from outpost.grammar import JSON_GRAMMAR, json_schema_to_grammar
    from outpost.grammar.gbnf import GrammarSyntaxError, check_gbnf

    check_gbnf(str(JSON_GRAMMAR))
    check_gbnf(json_schema_to_grammar({"type": "array", "items": {"type": "integer"}, "maxItems": 3}))
    check_gbnf('root ::= ( "x"\n  | [^a-z] )+ "\\x41" b{1,3} # note\nb ::= .\n')
    bad = {
        "root ::= foo": "'foo' is used but never defined",
        'x ::= "a"': "no 'root' rule",
        'root ::= "abc': "unterminated string",
        "root ::= [a-z": "unterminated character class",
        'root ::= * "a"': "must follow an item",
        'root := "a"': "expected ::=",
        'root ::= ("a" | "b"': "expected )",
        'root ::= "\\q"': "unknown escape",
        'root ::= "a"{2,1}': "n must not be less than m",
        "  ": "empty",
    }
    for text, why in bad.items():
        with pytest.raises(GrammarSyntaxError, match=re.escape(why)):
            check_gbnf(text)
