"""Grammars that constrain output: JSON for `response_format`, from llama.cpp's GBNF tooling.

`response_format: json_object` uses llama.cpp's JSON grammar; `json_schema` goes through the
schema -> GBNF converter that ships with the pinned bindings (so it matches the grammar engine).
"""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

JSON_GRAMMAR: str = JSON_GBNF


def json_schema_to_grammar(schema: dict[str, Any]) -> str:
    """GBNF for documents matching `schema`; ValueError with the reason for a schema it can't take."""
    if not isinstance(schema, dict):
        raise ValueError("json_schema.schema must be a JSON object")
    try:
        return str(json_schema_to_gbnf(json.dumps(schema)))
    except (KeyError, ValueError, TypeError, AssertionError, RecursionError) as exc:
        raise ValueError(f"unsupported JSON schema: {exc}") from exc
    except Exception as exc:  # the converter raises bare Exceptions for unsupported constructs
        raise ValueError(f"unsupported JSON schema: {exc}") from exc
