"""Sentence embeddings (mean pooling) on a context of their own, so they never take generation slots.

`Embedder` loads a GGUF (the served model or a dedicated embedding model) with `embeddings=True`
and mean pooling, embeds texts a batch at a time, and returns L2-normalised vectors.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.lib import ensure_backend, llama, recent_problems
from outpost.engine.model import ModelLoadError
from outpost.engine.vocab import Vocab
from outpost.messages import EmbedInput
from outpost.scheduler.output import BatchChunk


class Embedder:
    """Thread-safe: calls are serialised on an internal lock (one llama context)."""

    def __init__(
        self, model_path: str, n_threads: int | None = None, n_ctx: int = 2048, n_seq: int = 8
    ) -> None:
        ensure_backend()
        cfg = EngineConfig(model_path=model_path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_seq_max=n_seq)
        self._lock = threading.Lock()
        self._ctx: Any = None
        model_params = llama.llama_model_default_params()
        # Pooling needs every token of a text in one micro-batch, which AMX's one-token mode
        # (cpu_probe.py) cannot give: there the embedding model keeps the plain layout.
        model_params.use_extra_bufts = cfg.weight_layout == "repacked"
        self._model: Any = llama.llama_model_load_from_file(model_path.encode(), model_params)
        if not self._model:
            raise ModelLoadError(f"could not load embedding model {model_path}: {recent_problems()}")
        try:
            self.vocab = Vocab(llama.llama_model_get_vocab(self._model))
            self.n_embd = int(llama.llama_model_n_embd(self._model))
            params = llama.llama_context_default_params()
            params.n_ctx = params.n_batch = params.n_ubatch = n_ctx
            params.n_seq_max = n_seq
            params.n_threads = params.n_threads_batch = n_threads or cfg.n_threads
            params.embeddings = True
            params.pooling_type = llama.LLAMA_POOLING_TYPE_MEAN
            params.kv_unified = True
            self._ctx = llama.llama_init_from_model(self._model, params)
            if not self._ctx:
                raise ModelLoadError(f"could not create an embedding context: {recent_problems()}")
        except BaseException:
            self.close()
            raise
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self._batch = TokenBatch(n_ctx)

    def count_tokens(self, text: str) -> int:
        return len(self.vocab.tokenize(text, add_special=True, parse_special=False))

    def embed(self, texts: Sequence[EmbedInput]) -> tuple[list[list[float]], int]:
        """Vectors for `texts` (strings or token ids, in order) and the number of tokens read;
        ValueError if one is too long or holds an id outside the vocabulary."""
        tokenized = [self._tokens(i, t) for i, t in enumerate(texts)]
        for i, tokens in enumerate(tokenized):
            if len(tokens) > self.n_ctx:
                raise ValueError(
                    f"input {i} has {len(tokens)} tokens; the embedding context holds {self.n_ctx}"
                )
        vectors: list[list[float]] = []
        with self._lock:
            for group in batch_groups(tokenized, self.n_seq, self.n_ctx):
                vectors.extend(self._embed_group(group))
        return vectors, sum(len(t) for t in tokenized)

    def _tokens(self, index: int, text: EmbedInput) -> list[int]:
        if isinstance(text, str):
            return self.vocab.tokenize(text, add_special=True, parse_special=False) or [0]
        bad = next((t for t in text if not 0 <= t < self.vocab.n_tokens), None)
        if bad is not None or not text:
            what = f"token id {bad} is out of range" if text else "an empty token list"
            raise ValueError(f"input {index} has {what}: the vocabulary has {self.vocab.n_tokens} tokens")
        return list(text)

    def _embed_group(self, group: list[list[int]]) -> list[list[float]]:
        llama.llama_memory_clear(llama.llama_get_memory(self._ctx), True)
        self._batch.fill([BatchChunk(seq, tokens, 0, True) for seq, tokens in enumerate(group)])
        self._batch.logits[: self._batch.struct.n_tokens] = 1  # pooling reads every token's output
        status = int(llama.llama_decode(self._ctx, self._batch.struct))
        if status != 0:
            raise RuntimeError(f"embedding decode failed with code {status}")
        out = []
        for seq in range(len(group)):
            ptr = llama.llama_get_embeddings_seq(self._ctx, seq)
            vec = np.ctypeslib.as_array(ptr, shape=(self.n_embd,)).astype(np.float64)
            norm = float(np.linalg.norm(vec))
            out.append((vec / norm if norm > 0 else vec).tolist())
        return out

    def close(self) -> None:
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None


def batch_groups(tokenized: list[list[int]], n_seq: int, n_ctx: int) -> list[list[list[int]]]:
    """Split inputs into decode groups of at most n_seq sequences and n_ctx tokens."""
    groups: list[list[list[int]]] = [[]]
    used = 0
    for tokens in tokenized:
        if groups[-1] and (len(groups[-1]) == n_seq or used + len(tokens) > n_ctx):
            groups.append([])
            used = 0
        groups[-1].append(tokens)
        used += len(tokens)
    return groups
