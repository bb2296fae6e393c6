"""A converted tokenizer: the GGUF vocabulary, its special tokens, add_bos/add_eos and chat template.

Owns deciding which kind a directory holds (`load_vocab`, which reads the files once), the chat
template (chat_template.jinja or tokenizer_config.json), and writing all of it as `tokenizer.*`
metadata. vocab_bpe.py and vocab_spm.py build the token lists from the shared pieces in
vocab_parts.py (special tokens, add_bos/add_eos, padding).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFWriter

from outpost.models.convert.vocab_bpe import is_byte_level, load_bpe
from outpost.models.convert.vocab_parts import GGUFVocab, TokenizerFiles, read_json
from outpost.models.convert.vocab_spm import load_spm


def chat_template(files: TokenizerFiles) -> str | list[dict[str, str]] | None:
    """chat_template.jinja (transformers >= 4.43 saves it apart), else tokenizer_config.json's."""
    jinja = files.model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = files.tok_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        return [{"name": str(t["name"]), "template": str(t["template"])} for t in template]
    if isinstance(template, str):
        return template
    return read_json(files.model_dir / "chat_template.json").get("chat_template")


def load_vocab(
    model_dir: Path, model_config: dict[str, Any], n_rows: int, pre_override: str | None = None
) -> GGUFVocab:
    """The vocabulary for a model (config.json: `model_config`) whose embedding has `n_rows` rows.

    A byte-level BPE tokenizer.json wins; otherwise a SentencePiece tokenizer.model; anything else
    is refused with the reason.
    """
    tokenizer_json = read_json(model_dir / "tokenizer.json")
    files = TokenizerFiles(
        model_dir, tokenizer_json, read_json(model_dir / "tokenizer_config.json"), model_config
    )
    if tokenizer_json and is_byte_level(tokenizer_json):
        vocab = load_bpe(files, n_rows, pre_override)
    elif (model_dir / "tokenizer.model").is_file():
        vocab = load_spm(files, n_rows)
    elif tokenizer_json:
        kind = (tokenizer_json.get("model") or {}).get("type")
        raise ValueError(
            f"{model_dir}/tokenizer.json is a {kind} tokenizer that is not byte-level, and there is no "
            "tokenizer.model; outpost convert reads byte-level BPE tokenizer.json or SentencePiece "
            "tokenizer.model"
        )
    else:
        raise FileNotFoundError(f"no tokenizer.json or tokenizer.model in {model_dir}")
    vocab.chat_template = chat_template(files)
    return vocab


def write_vocab(writer: GGUFWriter, vocab: GGUFVocab) -> None:
    """The tokenizer.ggml.* keys and the chat template."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    for kind, token_id in vocab.special_ids.items():
        getattr(writer, f"add_{kind}_token_id")(token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
