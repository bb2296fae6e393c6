"""Grammars (GBNF text) that constrain output: JSON, JSON schemas, tool calls. Pure Python.

No llama_cpp import: the API layer (and a gateway without a model) can build and check grammars;
the engine only receives the GBNF text. `json_schema_to_grammar` honours what schemas use:
`enum`, `const`, `required`, `minLength`/`maxLength`, `minItems`/`maxItems`, integer
`minimum`/`maximum`, and number bounds (as integers or plain decimals that stay in range).
"""

from __future__ import annotations

from typing import Any

from outpost.grammar import converter

_Converter: Any = converter.SchemaConverter  # vendored and untyped

# llama.cpp's grammars/json.gbnf, as llama-cpp-python 0.3.36 ships it (MIT)
JSON_GRAMMAR = r"""
root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
"""

__all__ = ["JSON_GRAMMAR", "GrammarBuilder", "json_schema_to_grammar"]


class GrammarBuilder:
    """Several schemas in one grammar: `rule(schema, name)` per part, then `grammar(root_expr)`."""

    def __init__(self) -> None:
        self._conv = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def rule(self, schema: Any, name: str) -> str:
        """The rule name matching `schema`; ValueError for a schema the converter can't take."""
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema must be a JSON object")
        try:
            resolved = self._conv.resolve_refs(schema, name)
            return str(self._conv.visit(resolved, name))
        except ValueError:
            raise
        except Exception as exc:  # vendored code fed strangers' schemas: any failure is a 400
            raise ValueError(f"unsupported JSON schema: {exc}") from exc

    def literal(self, text: str) -> str:
        """`text` as a GBNF string literal."""
        return str(self._conv._format_literal(text))

    def grammar(self, root: str) -> str:
        """The GBNF text with `root ::= root`; the rules made so far follow."""
        rules = self._conv.format_grammar()
        return f"root ::= {root}\n{rules}\n"


def json_schema_to_grammar(schema: Any) -> str:
    """GBNF for documents matching `schema`; ValueError with the reason for one it can't take."""
    builder = GrammarBuilder()
    name = builder.rule(schema, "doc")
    return builder.grammar(name)
