"""Named model shapes for synthetic GGUFs: the hyperparameters of real small models, plus `tiny`.

The non-tiny shapes copy the published configs of HuggingFaceTB/SmolLM2-{135M,360M,1.7B}-Instruct
and Qwen/Qwen2.5-0.5B-Instruct exactly, so a synthetic file costs the same FLOPs, memory and KV cache
per token as the real one. Weight statistics are chosen here too, since they are part of the shape's
intended use (peaked logits for tests, sane small values for speed runs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """Everything needed to lay out one llama-family GGUF."""

    name: str
    arch: str  # GGUF general.architecture: "llama" or "qwen2"
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rope_theta: float
    rms_eps: float
    tied_embeddings: bool = True
    qkv_bias: bool = False  # qwen2 has q/k/v biases
    # Standard deviations of the random init: embedding rows, attention q/k, every other 2-D weight.
    # Values do not affect speed; these keep output varied. Embeddings at 0.1 give logits with std
    # ~sqrt(n_embd) * 0.1, so sampling is not uniform over the vocab; matrices at 0.04, not 0.02,
    # because at 0.02 the 30-layer stacks fall into one fixed token (" consult consult ...").
    embd_std: float = 0.1
    qk_std: float = 0.02
    weight_std: float = 0.04
    out_std: float = 0.1  # output.weight, when embeddings are not tied

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def __post_init__(self) -> None:
        if self.n_embd % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError(f"{self.name}: heads must divide n_embd and kv heads must divide heads")

    def n_params(self) -> int:
        """Parameter count, counting tied embeddings once (what ends up in the file)."""
        kv = self.n_head_kv * self.head_dim
        attn = 2 * self.n_embd * self.n_embd + 2 * self.n_embd * kv
        bias = (self.n_embd + 2 * kv) if self.qkv_bias else 0
        layer = attn + bias + 3 * self.n_embd * self.n_ff + 2 * self.n_embd
        head = 0 if self.tied_embeddings else self.n_vocab * self.n_embd
        return self.n_vocab * self.n_embd + self.n_layer * layer + self.n_embd + head


# fmt: off
# (a hyperparameter table reads best aligned)
_LLAMA = "llama"
SHAPES: dict[str, ModelShape] = {shape.name: shape for shape in (
    # ~15 MB at f16: 4 layers, GQA, head_dim 64 (the size GPU attention kernels expect). Untied
    # output matrix so the next token is not just the input token again: with tied embeddings a
    # random model echoes its input unless the layers are so strong that float rounding differences
    # between batch shapes blow up. Init tuned with llama.cpp (numbers in data/README.md): logit std
    # ~16, median top-1 margin ~3, batched vs one-by-one decoding differ by ~0.02, and the context
    # moves logits by ~20 so cache bugs show.
    ModelShape("tiny", _LLAMA, n_layer=4, n_embd=256, n_head=4, n_head_kv=2, n_ff=768,
               n_vocab=8192, n_ctx_train=8192, rope_theta=100000.0, rms_eps=1e-5,
               tied_embeddings=False, embd_std=1.0, out_std=1.0, qk_std=0.02, weight_std=0.05),
    ModelShape("smollm2-135m", _LLAMA, n_layer=30, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536,
               n_vocab=49152, n_ctx_train=8192, rope_theta=100000.0, rms_eps=1e-5),
    ModelShape("smollm2-360m", _LLAMA, n_layer=32, n_embd=960, n_head=15, n_head_kv=5, n_ff=2560,
               n_vocab=49152, n_ctx_train=8192, rope_theta=100000.0, rms_eps=1e-5),
    ModelShape("smollm2-1.7b", _LLAMA, n_layer=24, n_embd=2048, n_head=32, n_head_kv=32, n_ff=8192,
               n_vocab=49152, n_ctx_train=8192, rope_theta=130000.0, rms_eps=1e-5),
    ModelShape("qwen2.5-0.5b", "qwen2", n_layer=24, n_embd=896, n_head=14, n_head_kv=2, n_ff=4864,
               n_vocab=151936, n_ctx_train=32768, rope_theta=1000000.0, rms_eps=1e-6, qkv_bias=True),
)}
# fmt: on


def get_shape(name: str) -> ModelShape:
    """Look a shape up by name, with an error that lists the valid ones."""
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown shape {name!r}; choose one of: {', '.join(SHAPES)}") from None
