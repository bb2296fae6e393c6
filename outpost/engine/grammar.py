"""Grammars that constrain output: kept as an alias of `outpost.grammar` (pure Python, no llama_cpp).

The converter moved to `outpost.grammar` so the API layer can build grammars without loading
llama.cpp; it honours integer bounds, which llama-cpp-python's converter ignored.
"""

from __future__ import annotations

from outpost.grammar import JSON_GRAMMAR, json_schema_to_grammar

__all__ = ["JSON_GRAMMAR", "json_schema_to_grammar"]
