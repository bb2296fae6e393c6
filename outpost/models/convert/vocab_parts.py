"""The pieces both tokenizer kinds (vocab_bpe.py, vocab_spm.py) build a GGUF vocabulary from.

Owns the `GGUFVocab` record, the HF files it is read from (`TokenizerFiles`, each read once), padding
to the embedding's rows, added tokens, the special tokens (tokenizer_config first, then config.json's
ids, then the kind's own defaults) and add_bos/add_eos (an explicit tokenizer_config flag, else what
tokenizer.json's post-processor template does, as transformers >= 5 stores it). vocab.py picks the kind
and writes the result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import TokenType

SPECIAL_KINDS = ("bos", "eos", "unk", "pad")


@dataclass
class GGUFVocab:
    """Everything `tokenizer.*` in the GGUF says. tokens[i] is token id i."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None
    merges: list[str] = field(default_factory=list)
    special_ids: dict[str, int] = field(default_factory=dict)
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool | None = None
    chat_template: str | list[dict[str, str]] | None = None


@dataclass(frozen=True)
class TokenizerFiles:
    """The HF files a vocabulary is built from, each read once ({} for a file that is absent)."""

    model_dir: Path
    tokenizer_json: dict[str, Any]
    tok_config: dict[str, Any]  # tokenizer_config.json
    model_config: dict[str, Any]  # config.json


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file, or {} when the file does not exist."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def padded(n_rows: int, used: int, what: str) -> tuple[list[str], list[int]]:
    """A token list of the embedding's size, filled with unused "[PADi]" entries.

    Checkpoints often have more embedding rows than tokens (Qwen2.5: 151936 rows for 151665
    tokens); llama.cpp needs exactly one vocabulary entry per row.
    """
    if used > n_rows:
        raise ValueError(f"the tokenizer has {used} tokens but the embedding only {n_rows} rows ({what})")
    return [f"[PAD{i}]" for i in range(n_rows)], [int(TokenType.UNUSED)] * n_rows


def added_tokens(files: TokenizerFiles) -> dict[int, tuple[str, bool]]:
    """Added tokens by id: (content, special), from tokenizer.json and tokenizer_config.json."""
    found: dict[int, tuple[str, bool]] = {}
    for key, data in (files.tok_config.get("added_tokens_decoder") or {}).items():
        found[int(key)] = (str(data["content"]), bool(data.get("special")))
    for data in files.tokenizer_json.get("added_tokens") or []:
        found[int(data["id"])] = (str(data["content"]), bool(data.get("special")))
    return found


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def find_special_ids(files: TokenizerFiles, tokens: list[str], fallback: dict[str, int]) -> dict[str, int]:
    """bos/eos/unk/pad ids: tokenizer_config.json's token text, else config.json's ids, else `fallback`."""
    index = {text: i for i, text in reversed(list(enumerate(tokens)))}  # first id wins
    ids: dict[str, int] = {}
    for kind in SPECIAL_KINDS:
        text = _token_text(files.tok_config.get(f"{kind}_token"))
        config_id = files.model_config.get(f"{kind}_token_id")
        if isinstance(config_id, list):  # e.g. Llama 3: several EOS ids; llama.cpp finds the rest by text
            config_id = config_id[0] if config_id else None
        if text is not None and text in index:
            ids[kind] = index[text]
        elif isinstance(config_id, int) and 0 <= config_id < len(tokens):
            ids[kind] = config_id
        elif kind in fallback and 0 <= fallback[kind] < len(tokens):
            ids[kind] = fallback[kind]
    return ids


def _template_adds(tokenizer_json: dict[str, Any], token: str | None, first: bool) -> bool | None:
    """Whether tokenizer.json's post-processor puts `token` first (or last) around a single text."""
    post = tokenizer_json.get("post_processor")
    nodes = (
        post.get("processors", []) if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
    )
    for node in nodes:
        if isinstance(node, dict) and node.get("type") == "TemplateProcessing":
            single = node.get("single") or []
            if not single:
                return False
            edge = single[0] if first else single[-1]
            return token is not None and edge.get("SpecialToken", {}).get("id") == token
    return None


def add_special_flags(
    files: TokenizerFiles, tokens: list[str], ids: dict[str, int], default_bos: bool
) -> tuple[bool, bool]:
    """(add_bos, add_eos) as the HF tokenizer applies them to a plain text."""
    result = []
    for kind, first, default in (("bos", True, default_bos), ("eos", False, False)):
        flag = files.tok_config.get(f"add_{kind}_token")
        if isinstance(flag, bool):
            result.append(flag)
            continue
        text = tokens[ids[kind]] if kind in ids else None
        from_template = _template_adds(files.tokenizer_json, text, first)
        result.append(default if from_template is None else from_template)
    return result[0], result[1]
