"""The reranker on llama.cpp: the synthetic rank-pooling BERT loads, and its scores are llama.cpp's own.

The reference below decodes each (query, document) pair alone on a fresh context, building the
tokens by hand as llama-server's format_prompt_rerank does; `Reranker` decodes them together,
several sequences per batch."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from outpost.engine.lib import ensure_backend, llama
from outpost.engine.rerank import Reranker
from outpost.messages import NotSupported

QUERY = "what is a cat"
DOCS = ["a cat is a small animal", "paris is in france", "the stock market fell", "cats purr"]


def reference_scores(path: Path, query: str, docs: list[str]) -> list[float]:
    ensure_backend()
    model = llama.llama_model_load_from_file(str(path).encode(), llama.llama_model_default_params())
    params = llama.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = 512
    params.embeddings, params.pooling_type, params.n_threads = True, llama.LLAMA_POOLING_TYPE_RANK, 2
    ctx = llama.llama_init_from_model(model, params)
    vocab = llama.llama_model_get_vocab(model)

    def tok(text: str) -> list[int]:
        raw, out = text.encode(), (llama.llama_token * 512)()
        return list(out[: llama.llama_tokenize(vocab, raw, len(raw), out, 512, False, False)])

    bos, eos, sep = llama.llama_vocab_bos(vocab), llama.llama_vocab_eos(vocab), llama.llama_vocab_sep(vocab)
    scores = []
    try:
        for doc in docs:
            tokens = [bos, *tok(query), eos, sep, *tok(doc), eos]
            batch = llama.llama_batch_init(512, 0, 1)
            for i, t in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, i, 1, 1
                batch.seq_id[i][0] = 0
            batch.n_tokens = len(tokens)
            llama.llama_memory_clear(llama.llama_get_memory(ctx), True)
            assert llama.llama_decode(ctx, batch) == 0
            scores.append(
                float(ctypes.cast(llama.llama_get_embeddings_seq(ctx, 0), ctypes.POINTER(ctypes.c_float))[0])
            )
            llama.llama_batch_free(batch)
    finally:
        llama.llama_free(ctx)
        llama.llama_model_free(model)
    return scores


def test_scores_are_llama_cpps_rank_pooling_of_llama_servers_pairs(reranker_model: Path) -> None:
    reranker = Reranker(str(reranker_model), n_threads=2)
    try:
        assert reranker.pair_tokens(QUERY, "x")[0] == reranker.vocab.bos  # [BOS] query [EOS] [SEP] doc [EOS]
        scores, n_tokens = reranker.score(QUERY, DOCS)
        again, _ = reranker.score(QUERY, list(reversed(DOCS)))
    finally:
        reranker.close()
    expected = reference_scores(reranker_model, QUERY, DOCS)
    assert scores == pytest.approx(expected, abs=1e-3)
    assert list(reversed(again)) == pytest.approx(scores, abs=1e-3)  # a document's score is its own
    assert len(set(round(s, 3) for s in scores)) == len(DOCS)  # the random head still tells them apart
    assert n_tokens > 4 * len(DOCS)


def test_a_model_without_rank_pooling_is_not_a_reranker(tiny_model: Path) -> None:
    with pytest.raises(NotSupported, match="not a reranker"):
        Reranker(str(tiny_model), n_threads=1)
