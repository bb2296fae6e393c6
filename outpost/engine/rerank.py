"""Reranking: one relevance score per (query, document) pair, from a rank-pooling GGUF.

A reranker (bge-reranker, jina-reranker, `outpost models synth --shape reranker-tiny`) is a
cross-encoder with a classification head: llama.cpp runs it with `LLAMA_POOLING_TYPE_RANK` and
`llama_get_embeddings_seq` gives the head's output, whose first value is the score. Each pair is
one sequence, tokenized as llama-server's `format_prompt_rerank` does: the model's `rerank` chat
template with `{query}`/`{document}` filled in where it has one, else `[BOS] query [EOS] [SEP]
document [EOS]` (each special token where the vocabulary says to add it; SEP stands in for a
missing EOS). Pairs are decoded several at a time on a context of the reranker's own.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from outpost.engine.batch import TokenBatch
from outpost.engine.embedding import batch_groups
from outpost.engine.lib import ensure_backend, llama, recent_problems
from outpost.engine.model import ModelLoadError
from outpost.engine.vocab import Vocab
from outpost.messages import NotSupported
from outpost.scheduler.output import BatchChunk

_RANK = 4  # LLAMA_POOLING_TYPE_RANK, as GGUF's `<arch>.pooling_type` stores it


class Reranker:
    """Thread-safe: calls are serialised on an internal lock (one llama context)."""

    def __init__(self, model_path: str, n_threads: int, n_ctx: int = 2048, n_seq: int = 8) -> None:
        ensure_backend()
        self._lock = threading.Lock()
        self._ctx: Any = None
        self._model: Any = llama.llama_model_load_from_file(
            model_path.encode(), llama.llama_model_default_params()
        )
        if not self._model:
            raise ModelLoadError(f"could not load reranking model {model_path}: {recent_problems()}")
        try:
            pooling = _meta(self._model, "pooling_type")
            if pooling != str(_RANK):
                raise NotSupported(
                    f"This server does not support reranking: {model_path} is not a reranker: "
                    f"its pooling type is {pooling or 'unset'}, "
                    "reranking needs a rank-pooling GGUF (a cross-encoder with a classification head)"
                )
            self.vocab = Vocab(llama.llama_model_get_vocab(self._model))
            handle = self.vocab.handle
            self._sep = int(llama.llama_vocab_sep(handle))
            self._add_eos = bool(llama.llama_vocab_get_add_eos(handle))
            self._add_sep = bool(llama.llama_vocab_get_add_sep(handle))
            template = llama.llama_model_chat_template(self._model, b"rerank")
            self._template: str | None = template.decode() if template else None
            params = llama.llama_context_default_params()
            params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
            params.n_seq_max = n_seq
            params.n_threads = params.n_threads_batch = n_threads
            params.embeddings = True
            params.pooling_type = _RANK
            params.kv_unified = True
            self._ctx = llama.llama_init_from_model(self._model, params)
            if not self._ctx:
                raise ModelLoadError(f"could not create a reranking context: {recent_problems()}")
        except BaseException:
            self.close()
            raise
        self.n_ctx, self.n_seq = n_ctx, n_seq
        self._batch = TokenBatch(n_ctx)

    def pair_tokens(self, query: str, document: str) -> list[int]:
        """llama-server's format_prompt_rerank."""
        if self._template is not None:
            text = self._template.replace("{query}", query).replace("{document}", document)
            return self.vocab.tokenize(text, add_special=False, parse_special=True)
        eos = self.vocab.eos if self.vocab.eos >= 0 else self._sep
        out = [self.vocab.bos] if self.vocab.add_bos else []
        out += self.vocab.tokenize(query, add_special=False, parse_special=False)
        out += [eos] if self._add_eos else []
        out += [self._sep] if self._add_sep else []
        out += self.vocab.tokenize(document, add_special=False, parse_special=False)
        out += [eos] if self._add_eos else []
        return out

    def score(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]:
        """One score per document, in order, and the tokens read; ValueError for a pair longer
        than the reranking context."""
        pairs = [self.pair_tokens(query, doc) for doc in documents]
        for i, tokens in enumerate(pairs):
            if len(tokens) > self.n_ctx:
                raise ValueError(
                    f"query + document {i}: {len(tokens)} tokens; the reranking context holds {self.n_ctx}"
                )
        scores: list[float] = []
        with self._lock:
            for group in batch_groups(pairs, self.n_seq, self.n_ctx):
                scores.extend(self._score_group(group))
        return scores, sum(len(t) for t in pairs)

    def _score_group(self, group: list[list[int]]) -> list[float]:
        llama.llama_memory_clear(llama.llama_get_memory(self._ctx), True)
        self._batch.fill([BatchChunk(seq, tokens, 0, True) for seq, tokens in enumerate(group)])
        self._batch.logits[: self._batch.struct.n_tokens] = 1  # pooling reads every token's output
        status = int(llama.llama_decode(self._ctx, self._batch.struct))
        if status != 0:
            raise RuntimeError(f"reranking decode failed with code {status}")
        return [float(llama.llama_get_embeddings_seq(self._ctx, seq)[0]) for seq in range(len(group))]

    def close(self) -> None:
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None


def _meta(model: Any, key: str) -> str | None:
    """A `<arch>.<key>` metadata value of the model, as text."""
    arch = _meta_raw(model, b"general.architecture")
    return _meta_raw(model, f"{arch}.{key}".encode()) if arch else None


def _meta_raw(model: Any, key: bytes) -> str | None:
    buf = (ctypes.c_char * 256)()
    n = int(llama.llama_model_meta_val_str(model, key, buf, len(buf)))
    return buf.value.decode("utf-8", errors="replace") if n >= 0 else None
