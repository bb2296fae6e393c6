"""The supported Hugging Face architectures and what each needs in GGUF.

Owns: the registry (HF class name -> llama.cpp architecture and its quirks), checks that a config
is something llama.cpp's graph for that architecture computes the same way, the `<arch>.*` metadata
keys, and tensors that are computed rather than copied (llama3 and longrope rope factors).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, TENSOR_NAMES, GGUFWriter, RopeScalingType

from outpost.models.convert.hparams import HParams, RopeConfig

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ArchSpec:
    """One HF architecture as llama.cpp runs it."""

    hf_name: str
    arch: MODEL_ARCH
    tied_default: bool  # transformers' default for tie_word_embeddings
    activations: tuple[str, ...]  # hidden_act values llama.cpp's graph computes
    rope_kinds: tuple[str, ...]
    # llama.cpp's llama graph rotates adjacent pairs (GPT-J style); HF rotates halves (NeoX style),
    # so Q and K rows are permuted within each head to keep q.k unchanged.
    permute_qk: bool = False
    # Gemma's RMSNorm multiplies by (1 + w); llama.cpp multiplies by w, so 1 is added at conversion.
    norm_shift: float = 0.0
    swa: bool = False  # llama.cpp implements this architecture's sliding-window attention

    @property
    def gguf_name(self) -> str:
        return MODEL_ARCH_NAMES[self.arch]


_LLAMA_ROPE = ("none", "linear", "yarn", "llama3")
_QWEN_ROPE = ("none", "linear", "yarn")
ARCHITECTURES: dict[str, ArchSpec] = {
    spec.hf_name: spec
    for spec in (
        ArchSpec("LlamaForCausalLM", MODEL_ARCH.LLAMA, False, ("silu",), _LLAMA_ROPE, permute_qk=True),
        ArchSpec("MistralForCausalLM", MODEL_ARCH.LLAMA, False, ("silu",), _LLAMA_ROPE, permute_qk=True),
        ArchSpec("Qwen2ForCausalLM", MODEL_ARCH.QWEN2, False, ("silu",), _QWEN_ROPE),
        ArchSpec("Qwen3ForCausalLM", MODEL_ARCH.QWEN3, False, ("silu",), _QWEN_ROPE),
        ArchSpec(
            "Gemma3ForCausalLM",
            MODEL_ARCH.GEMMA3,
            True,
            ("gelu_pytorch_tanh",),
            ("none", "linear"),
            norm_shift=1.0,
            swa=True,
        ),
        ArchSpec("Phi3ForCausalLM", MODEL_ARCH.PHI3, False, ("silu",), ("none", "longrope")),
    )
}


def arch_for(config: dict[str, object]) -> ArchSpec:
    """The spec for config.json's `architectures[0]`, or a ValueError listing what is supported."""
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names else None
    spec = ARCHITECTURES.get(str(name))
    if spec is None:
        raise ValueError(
            f"architecture {name or '(none in config.json)'} is not supported; "
            f"outpost convert supports: {', '.join(ARCHITECTURES)}"
        )
    return spec


def validate(spec: ArchSpec, hp: HParams) -> None:
    """Refuse configs that llama.cpp's graph would silently compute differently."""
    where = spec.hf_name
    if hp.hidden_act not in spec.activations:
        raise ValueError(
            f"{where}: activation {hp.hidden_act!r} is not supported (llama.cpp uses {spec.activations[0]})"
        )
    if hp.rope.kind not in spec.rope_kinds:
        raise ValueError(
            f"{where}: rope scaling {hp.rope.kind!r} is not supported (only: {', '.join(spec.rope_kinds)})"
        )
    if hp.n_head % hp.n_head_kv:
        raise ValueError(f"{where}: {hp.n_head} attention heads do not divide into {hp.n_head_kv} KV heads")
    if hp.rope_dim % 2 or not 0 < hp.rope_dim <= hp.head_dim:
        raise ValueError(f"{where}: rotary dimension {hp.rope_dim} does not fit head size {hp.head_dim}")
    if spec.permute_qk and hp.rope_dim != hp.head_dim:
        raise ValueError(f"{where}: partial rotary embeddings are not supported by llama.cpp's llama graph")
    if spec.arch == MODEL_ARCH.GEMMA3:
        _validate_gemma3(hp)
    # Phi-4-mini declares a window as long as its context: that one changes nothing.
    window_matters = hp.sliding_window is not None and hp.sliding_window < hp.n_ctx
    if any(hp.swa_layers) and window_matters and not spec.swa:
        _log.warning(
            "%s: llama.cpp's %s graph has no sliding-window attention; prompts longer than %s tokens "
            "will attend further back than the original model does",
            where,
            spec.gguf_name,
            hp.sliding_window,
        )


def _validate_gemma3(hp: HParams) -> None:
    if hp.attn_logit_softcap is not None:
        raise ValueError(
            "Gemma3ForCausalLM: attn_logit_softcapping is not supported by llama.cpp's gemma3 graph"
        )
    if hp.rope_swa is not None and hp.rope_swa.kind != "none":
        raise ValueError("Gemma3ForCausalLM: rope scaling on sliding-window layers is not supported")
    # llama.cpp scales queries by 1/sqrt(head_dim), except for the 62-layer (27B) model where it
    # uses 1/sqrt(n_embd/n_head); HF uses query_pre_attn_scalar ** -0.5. They must agree.
    expected = hp.n_embd / hp.n_head if hp.n_layer == 62 else hp.head_dim
    scalar = hp.query_pre_attn_scalar or hp.head_dim
    if not math.isclose(scalar, expected, rel_tol=1e-6):
        raise ValueError(
            f"Gemma3ForCausalLM: query_pre_attn_scalar {scalar:g} differs from the {expected:g} "
            "llama.cpp assumes"
        )


def write_hparams(writer: GGUFWriter, spec: ArchSpec, hp: HParams, n_vocab: int) -> None:
    """The `<arch>.*` keys llama.cpp's loader reads for this architecture."""
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(hp.n_ctx)
    writer.add_embedding_length(hp.n_embd)
    writer.add_block_count(hp.n_layer)
    writer.add_feed_forward_length(hp.n_ff)
    writer.add_head_count(hp.n_head)
    writer.add_head_count_kv(hp.n_head_kv)
    writer.add_key_length(hp.head_dim)
    writer.add_value_length(hp.head_dim)
    writer.add_layer_norm_rms_eps(hp.rms_eps)
    writer.add_rope_dimension_count(hp.rope_dim)
    writer.add_rope_freq_base(hp.rope.theta)
    _write_rope_scaling(writer, hp.rope)
    if spec.swa and any(hp.swa_layers) and hp.sliding_window:
        writer.add_sliding_window(hp.sliding_window)
        writer.add_sliding_window_pattern(list(hp.swa_layers))
        writer.add_rope_freq_base_swa(hp.rope_swa.theta if hp.rope_swa else 10000.0)
    if hp.final_logit_softcap:
        writer.add_final_logit_softcapping(hp.final_logit_softcap)


def _write_rope_scaling(writer: GGUFWriter, rope: RopeConfig) -> None:
    if rope.kind == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(rope.factor)
    elif rope.kind == "yarn":
        writer.add_rope_scaling_type(RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope.factor)
        if rope.original_context:
            writer.add_rope_scaling_orig_ctx_len(rope.original_context)
        if rope.beta_fast is not None:
            writer.add_rope_scaling_yarn_beta_fast(rope.beta_fast)
        if rope.beta_slow is not None:
            writer.add_rope_scaling_yarn_beta_slow(rope.beta_slow)
    elif rope.kind == "longrope":
        # The factors travel as tensors (extra_tensors); llama.cpp picks long or short by comparing
        # the context size with this original length, as transformers does with the sequence length.
        assert rope.original_context is not None
        writer.add_rope_scaling_orig_ctx_len(rope.original_context)
        writer.add_rope_scaling_attn_factors(rope.attention_factor)
    # llama3: only a rope_freqs tensor (extra_tensors); llama.cpp divides each frequency by it.


def llama3_rope_factors(rope: RopeConfig, rope_dim: int) -> np.ndarray:
    """Per-frequency divisors equivalent to Llama 3's rope scaling (Meta's reference formula)."""
    assert rope.original_context is not None
    inv_freq = 1.0 / rope.theta ** (np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = rope.original_context / rope.low_freq_factor
    high_wavelen = rope.original_context / rope.high_freq_factor
    smooth = (rope.original_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    # Long wavelengths are stretched by `factor`, short ones kept, the band between blended.
    factors = np.where(
        wavelen < high_wavelen,
        1.0,
        np.where(wavelen > low_wavelen, rope.factor, 1.0 / ((1 - smooth) / rope.factor + smooth)),
    )
    return factors.astype(np.float32)


def extra_tensors(spec: ArchSpec, hp: HParams) -> list[tuple[str, np.ndarray]]:
    """Tensors computed from the config: (GGUF name, float32 data)."""
    rope = hp.rope
    if rope.kind == "llama3":
        if rope.original_context is None:
            raise ValueError(f"{spec.hf_name}: llama3 rope scaling needs original_max_position_embeddings")
        return [(TENSOR_NAMES[MODEL_TENSOR.ROPE_FREQS] + ".weight", llama3_rope_factors(rope, hp.rope_dim))]
    if rope.kind == "longrope":
        if len(rope.long_factor) != hp.rope_dim // 2:
            raise ValueError(
                f"{spec.hf_name}: longrope factors have {len(rope.long_factor)} entries, "
                f"expected {hp.rope_dim // 2}"
            )
        return [
            (
                TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_LONG] + ".weight",
                np.array(rope.long_factor, np.float32),
            ),
            (
                TENSOR_NAMES[MODEL_TENSOR.ROPE_FACTORS_SHORT] + ".weight",
                np.array(rope.short_factor, np.float32),
            ),
        ]
    return []
