"""A synthetic cross-encoder reranker: a small BERT with a classification head, rank pooling.

llama.cpp serves such a model (bge-reranker, jina-reranker) with `LLAMA_POOLING_TYPE_RANK`: the
encoder reads `[BOS] query [EOS] [SEP] document [EOS]`, the first token's hidden state goes through
the head (`cls.weight/bias`, tanh, `cls.output.weight/bias`), and the one output is the relevance
score. This file has that layout (llama.cpp's `bert` architecture: learned positions, token types,
LayerNorms with biases, GELU FFN) with seeded random weights and the synthetic models' tokenizer
(tokenizer.py), plus what the BERT loader and `format_rerank` read: `bert.pooling_type` = rank,
one classifier label, add BOS/EOS/SEP. Random weights: scores are deterministic, not meaningful.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter, LlamaFileType, PoolingType

from outpost.models.files import temp_path_beside
from outpost.models.synth import finish_small_gguf
from outpost.models.tokenizer import ENDOFTEXT_ID, add_tokenizer_metadata, build_vocab

SHAPE = "reranker-tiny"
N_VOCAB, N_EMBD, N_HEAD, N_FF, N_LAYER, N_CTX = 8192, 128, 4, 512, 2, 512
_WEIGHT_STD = 0.08


def _tensors(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    d, ff = N_EMBD, N_FF

    def mat(rows: int, cols: int, std: float = _WEIGHT_STD) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * std).astype(np.float16)

    def vec(n: int, base: float = 0.0, std: float = 0.02) -> np.ndarray:
        return (base + rng.standard_normal(n, dtype=np.float32) * std).astype(np.float32)

    out = [
        ("token_embd.weight", mat(N_VOCAB, d, 1.0)),
        # f32: the graph adds row 0 to every input as it is (ggml's add takes no f16 operand here).
        ("token_types.weight", mat(2, d, 0.1).astype(np.float32)),
        ("position_embd.weight", mat(N_CTX, d, 0.1)),
        ("token_embd_norm.weight", vec(d, 1.0)),
        ("token_embd_norm.bias", vec(d)),
    ]
    for i in range(N_LAYER):
        blk = f"blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            out += [(f"{blk}.{name}.weight", mat(d, d)), (f"{blk}.{name}.bias", vec(d))]
        out += [
            (f"{blk}.attn_output_norm.weight", vec(d, 1.0)),
            (f"{blk}.attn_output_norm.bias", vec(d)),
            (f"{blk}.ffn_up.weight", mat(ff, d)),
            (f"{blk}.ffn_up.bias", vec(ff)),
            (f"{blk}.ffn_down.weight", mat(d, ff)),
            (f"{blk}.ffn_down.bias", vec(d)),
            (f"{blk}.layer_output_norm.weight", vec(d, 1.0)),
            (f"{blk}.layer_output_norm.bias", vec(d)),
        ]
    # The head: scores spread over a few units, so documents order clearly.
    out += [
        ("cls.weight", mat(d, d, 0.3)),
        ("cls.bias", vec(d)),
        ("cls.output.weight", mat(1, d, 1.0)),
        ("cls.output.bias", vec(1)),
    ]
    return out


def write_reranker_gguf(out_path: Path, seed: int = 0) -> Path:
    """Writes the reranker (f16 matrices, f32 vectors, ~3 MB) to `out_path`, atomically."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_beside(out_path, "rerank")
    try:
        writer = GGUFWriter(tmp, "bert")
        writer.add_type("model")
        writer.add_name(f"outpost-synthetic-{SHAPE}")
        writer.add_description("Random weights in a reranker's shape; not a trained model.")
        writer.add_file_type(LlamaFileType.MOSTLY_F16)
        writer.add_vocab_size(N_VOCAB)
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(N_LAYER)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_layer_norm_eps(1e-12)
        writer.add_causal_attention(False)
        writer.add_pooling_type(PoolingType.RANK)
        writer.add_classifier_output_labels(["relevance"])
        writer.add_string("outpost.synthetic.shape", SHAPE)
        writer.add_uint32("outpost.synthetic.seed", seed)
        add_tokenizer_metadata(writer, build_vocab(N_VOCAB), rerank=True)
        writer.add_token_type_count(2)
        writer.add_sep_token_id(ENDOFTEXT_ID)
        writer.add_add_sep_token(True)
        finish_small_gguf(writer, _tensors(np.random.default_rng([seed, 0x4E4B])), tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path
