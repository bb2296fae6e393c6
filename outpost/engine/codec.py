"""The prompt codec: tokenize, render chat, detokenize, from a model's vocabulary and chat template.

`LlamaCodec` is what `outpost.backend.PromptCodec` asks for. A serving engine builds one over its
loaded model (`LoadedModel.codec`); a gateway builds one with `load_codec(path)`, which opens the
GGUF vocab-only: llama.cpp reads the tokenizer and metadata and never the weights, so a gateway
validates, tokenizes and counts tokens for a 20B model in a few MB.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from outpost.engine.chat_template import ChatTemplate, ChatTemplateError
from outpost.engine.lib import ensure_backend, llama, recent_problems
from outpost.engine.vocab import Vocab
from outpost.messages import FimTokens


def read_metadata(model: Any, key: str) -> str | None:
    """A GGUF metadata value of a loaded llama_model as text, or None when the key is absent."""
    size = 256
    while True:
        buf = ctypes.create_string_buffer(size)
        n = int(llama.llama_model_meta_val_str(model, key.encode(), buf, size))
        if n < 0:
            return None
        if n < size:
            return buf.value.decode("utf-8", errors="replace")
        size = n + 1


class LlamaCodec:
    """Text <-> tokens and chat messages -> prompt text for one model (a `PromptCodec`)."""

    def __init__(self, vocab: Vocab, template_source: str | None) -> None:
        self.vocab = vocab
        self._template_source = template_source
        self._template = (
            ChatTemplate(template_source, bos_token=vocab.bos_text, eos_token=vocab.eos_text)
            if template_source
            else None
        )

    @property
    def n_vocab(self) -> int:
        return self.vocab.n_tokens

    @property
    def chat_template_source(self) -> str | None:
        return self._template_source

    @property
    def fim_tokens(self) -> FimTokens:
        return self.vocab.fim

    @property
    def bos_token(self) -> int:
        return self.vocab.bos if self.vocab.add_bos else -1

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def tokenize_prompt(self, text: str, add_special: bool = True) -> list[int]:
        bos_text = self.vocab.bos_text
        add = add_special and not (bos_text and text.startswith(bos_text))
        return self.vocab.tokenize(text, add_special=add, parse_special=True)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.vocab.detokenize(list(tokens))

    def token_piece(self, token: int) -> bytes:
        return self.vocab.token_to_piece(token)

    def render_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if self._template is None:
            raise ChatTemplateError(
                "this model has no chat template; give one with --chat-template FILE (a jinja file)"
            )
        return self._template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)


class VocabOnlyModel:
    """A GGUF opened vocab-only: its codec and metadata, no weights, no context. `close()` frees it."""

    def __init__(self, path: str, chat_template: str | None = None) -> None:
        ensure_backend()
        params = llama.llama_model_default_params()
        params.vocab_only = True
        self._model: Any = llama.llama_model_load_from_file(path.encode(), params)
        if not self._model:
            raise ValueError(f"llama.cpp could not read {path}: {recent_problems() or 'not a GGUF model?'}")
        self.path = path
        # A vocab-only load skips the hyperparameters: read the trained context from the metadata.
        arch = self.metadata("general.architecture") or ""
        self.n_ctx_train = int(self.metadata(f"{arch}.context_length") or 0)
        vocab = Vocab(llama.llama_model_get_vocab(self._model))
        self.codec = LlamaCodec(vocab, chat_template or self.metadata("tokenizer.chat_template"))

    def metadata(self, key: str) -> str | None:
        return read_metadata(self._model, key)

    def describe(self) -> dict[str, Any]:
        return {
            "n_ctx_train": self.n_ctx_train,
            "n_vocab": self.codec.n_vocab,
            "architecture": self.metadata("general.architecture"),
            "name": self.metadata("general.name"),
        }

    def close(self) -> None:
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None


def load_codec(path: str, chat_template: str | None = None) -> VocabOnlyModel:
    """Open `path` vocab-only (the weights are never read) for its codec and metadata."""
    return VocabOnlyModel(path, chat_template)
