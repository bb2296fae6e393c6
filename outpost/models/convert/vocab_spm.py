"""SentencePiece tokenizer.model (Llama 2, Mistral/Zephyr, TinyLlama, Gemma 3, Phi-3) as a "llama" GGUF vocab.

Owns: parsing the model proto (pieces, scores, piece types, normalizer options) through
sentencepiece's generated protobuf module, adding tokens the HF side appended or renamed (Phi-3's
<|end|> and friends), and the options llama.cpp's SPM tokenizer reads: add_space_prefix (the
proto's add_dummy_prefix). Piece types in the proto use the same numbers as GGUF token types.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from gguf import TokenType

from outpost.models.convert.vocab_parts import (
    GGUFVocab,
    TokenizerFiles,
    add_special_flags,
    added_tokens,
    find_special_ids,
    padded,
)

_log = logging.getLogger(__name__)
_ADDED_SCORE = -1000.0  # added tokens never win a SentencePiece merge
_PAD_SCORE = -10000.0


def _load_proto(path: Path) -> Any:
    from sentencepiece import sentencepiece_model_pb2  # protobuf-generated; needs `protobuf`

    proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # built at import time
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as exc:  # protobuf's DecodeError has no stable import path
        raise ValueError(f"{path} is not a SentencePiece model: {exc}") from None
    if not proto.pieces:
        raise ValueError(f"{path} is not a SentencePiece model (no pieces)")
    return proto


def _warn_normalizer(proto: Any, path: Path) -> None:
    """llama.cpp's SPM tokenizer only escapes spaces; say so when the model normalizes more."""
    spec = proto.normalizer_spec
    if spec.name not in ("identity", "") or spec.remove_extra_whitespaces:
        _log.warning(
            "%s normalizes text (%s%s) and llama.cpp does not: token ids can differ on such text",
            path.name,
            spec.name,
            ", remove_extra_whitespaces" if spec.remove_extra_whitespaces else "",
        )
    if proto.trainer_spec.treat_whitespace_as_suffix:
        raise ValueError(f"{path.name}: treat_whitespace_as_suffix is not supported")


def load_spm(files: TokenizerFiles, n_rows: int) -> GGUFVocab:
    """The "llama" vocabulary for `n_rows` embedding rows."""
    path = files.model_dir / "tokenizer.model"
    proto = _load_proto(path)
    _warn_normalizer(proto, path)
    extra = added_tokens(files)
    used = max([len(proto.pieces) - 1, *extra.keys()]) + 1
    tokens, types = padded(n_rows, used, "tokenizer.model")
    scores = [_PAD_SCORE] * n_rows
    for token_id, piece in enumerate(proto.pieces):
        tokens[token_id] = piece.piece
        scores[token_id] = float(piece.score)
        types[token_id] = int(piece.type)
    for token_id, (text, special) in extra.items():
        if token_id < len(proto.pieces) and tokens[token_id] == text:
            # The proto's own piece: keep its type (unknown, control, byte), except that a piece HF
            # calls special (Gemma's <end_of_turn>) becomes control, so output never shows it.
            if special and types[token_id] in (TokenType.NORMAL, TokenType.USER_DEFINED):
                types[token_id] = int(TokenType.CONTROL)
            continue
        # Other added tokens extend the vocabulary or rename a piece (Phi-3 reuses unused ones).
        tokens[token_id] = text
        scores[token_id] = _ADDED_SCORE
        types[token_id] = int(TokenType.CONTROL if special else TokenType.USER_DEFINED)
    trainer = proto.trainer_spec
    fallback = {"unk": trainer.unk_id, "bos": trainer.bos_id, "eos": trainer.eos_id, "pad": trainer.pad_id}
    ids = find_special_ids(files, tokens, fallback)
    # LlamaTokenizer's default (and llama.cpp's for SPM) is to add BOS.
    add_bos, add_eos = add_special_flags(files, tokens, ids, default_bos=True)
    return GGUFVocab(
        model="llama",
        pre="default",
        tokens=tokens,
        types=types,
        scores=scores,
        special_ids=ids,
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=bool(proto.normalizer_spec.add_dummy_prefix),
    )
