"""Byte-level BPE from tokenizer.json (GPT-2 style: SmolLM2, Llama 3, Qwen, Phi-4) as a "gpt2" GGUF vocab.

Owns: reading the BPE model's vocab and merges (both the "a b" and the ["a", "b"] merge spellings),
typing added tokens (special -> control, others -> user-defined, whose text llama.cpp matches
verbatim), and the pre-tokenizer choice (pretokenizer.py).
"""

from __future__ import annotations

from typing import Any

from gguf import TokenType

from outpost.models.convert.pretokenizer import choose_pre_tokenizer
from outpost.models.convert.vocab_parts import (
    GGUFVocab,
    TokenizerFiles,
    add_special_flags,
    added_tokens,
    find_special_ids,
    padded,
)


def _has_byte_level(node: Any) -> bool:
    if not isinstance(node, dict):
        return False
    if node.get("type") == "ByteLevel":
        return True
    children = node.get("pretokenizers") or []
    return any(_has_byte_level(child) for child in children)


def is_byte_level(tokenizer_json: dict[str, Any]) -> bool:
    """True for a BPE model whose pre-tokenizer maps bytes to GPT-2's printable characters."""
    model = tokenizer_json.get("model") or {}
    return model.get("type") == "BPE" and _has_byte_level(tokenizer_json.get("pre_tokenizer"))


def _merges(model: dict[str, Any]) -> list[str]:
    merges = []
    for merge in model.get("merges") or []:
        pair = merge.split(" ") if isinstance(merge, str) else list(merge)
        if len(pair) != 2:
            raise ValueError(f"tokenizer.json has a malformed merge: {merge!r}")
        merges.append(f"{pair[0]} {pair[1]}")
    return merges


def load_bpe(files: TokenizerFiles, n_rows: int, pre_override: str | None) -> GGUFVocab:
    """The "gpt2" vocabulary for `n_rows` embedding rows (spare rows become unused "[PADi]" tokens)."""
    pre = choose_pre_tokenizer(files.tokenizer_json, pre_override)
    model = files.tokenizer_json["model"]
    base: dict[str, int] = model.get("vocab") or {}
    extra = added_tokens(files)
    used = max([*base.values(), *extra.keys()], default=-1) + 1
    tokens, types = padded(n_rows, used, "tokenizer.json")
    for text, token_id in base.items():
        tokens[token_id] = text
        types[token_id] = int(TokenType.NORMAL)
    for token_id, (text, special) in extra.items():
        tokens[token_id] = text
        types[token_id] = int(TokenType.CONTROL if special else TokenType.USER_DEFINED)
    ids = find_special_ids(files, tokens, {})
    add_bos, add_eos = add_special_flags(files, tokens, ids, default_bos=False)
    return GGUFVocab(
        model="gpt2",
        pre=pre,
        tokens=tokens,
        types=types,
        merges=_merges(model),
        special_ids=ids,
        add_bos=add_bos,
        add_eos=add_eos,
    )
