"""Hyperparameters of a Hugging Face causal LM, read from its config.json into typed dataclasses.

Owns the differences between config generations: transformers >= 5 writes `rope_parameters` (for
Gemma 3 one entry per layer type), older releases write `rope_theta` + `rope_scaling` (+ Gemma 3's
`rope_local_base_freq`); sliding-window layers come from `layer_types` or a repeating pattern.
Which values an architecture accepts is checked in archs.py, not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base frequency and the scaling llama.cpp has to reproduce."""

    theta: float
    kind: str = "none"  # none (HF "default"), linear, yarn, llama3 or longrope
    factor: float = 1.0
    original_context: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    long_factor: tuple[float, ...] = ()  # longrope
    short_factor: tuple[float, ...] = ()  # longrope
    attention_factor: float = 1.0  # longrope: cos/sin multiplier
    beta_fast: float | None = None  # yarn
    beta_slow: float | None = None  # yarn


@dataclass(frozen=True)
class HParams:
    """What the GGUF writer needs to know about the network (per-architecture extras are optional)."""

    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int
    rms_eps: float
    rope: RopeConfig
    rope_dim: int
    tied_embeddings: bool
    hidden_act: str
    sliding_window: int | None = None
    swa_layers: tuple[bool, ...] = ()  # per layer: True = sliding-window attention
    rope_swa: RopeConfig | None = None  # Gemma 3's local layers
    final_logit_softcap: float | None = None
    attn_logit_softcap: float | None = None
    query_pre_attn_scalar: float | None = None


def _require(config: dict[str, Any], *keys: str) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    raise ValueError(f"config.json has no {' / '.join(keys)}")


def rope_sections(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Rope settings per layer type ("full_attention", "sliding_attention"), either config generation."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        return {str(k): dict(v) for k, v in params.items()}  # transformers 5, per layer type
    if isinstance(params, dict) and params:
        return {"full_attention": dict(params)}
    legacy = dict(config.get("rope_scaling") or {})
    if "rope_theta" in config:
        legacy.setdefault("rope_theta", config["rope_theta"])
    sections = {"full_attention": legacy}
    if "rope_local_base_freq" in config:  # Gemma 3 before transformers 5
        sections["sliding_attention"] = {"rope_theta": config["rope_local_base_freq"]}
    return sections


def parse_rope(params: dict[str, Any], config: dict[str, Any], default_theta: float = 10000.0) -> RopeConfig:
    """One RopeConfig from an HF rope dict (rope_type/type, factor, ...)."""
    theta = float(params.get("rope_theta", config.get("rope_theta", default_theta)))
    kind = str(params.get("rope_type") or params.get("type") or "default").lower()
    original = params.get("original_max_position_embeddings", config.get("original_max_position_embeddings"))
    original = int(original) if original else None
    if kind == "default":
        return RopeConfig(theta)
    if kind == "linear":
        return RopeConfig(theta, "linear", float(params["factor"]))
    if kind == "yarn":
        return _yarn(theta, params, original)
    if kind == "llama3":
        return RopeConfig(
            theta,
            "llama3",
            float(params["factor"]),
            original,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        )
    if kind in ("longrope", "su"):
        return _longrope(theta, params, config, original)
    raise ValueError(
        f"rope scaling type {kind!r} is not supported; outpost convert handles: "
        "default, linear, yarn, llama3, longrope"
    )


def _yarn(theta: float, params: dict[str, Any], original: int | None) -> RopeConfig:
    factor = float(params["factor"])
    given = params.get("attention_factor")
    # llama.cpp derives YaRN's magnitude scale as 0.1 * ln(factor) + 1, as HF does by default;
    # a different explicit value cannot be expressed in the GGUF keys llama.cpp reads for these models.
    if given is not None and abs(float(given) - (0.1 * math.log(factor) + 1.0)) > 1e-6:
        raise ValueError(f"yarn attention_factor {given} differs from 0.1*ln(factor)+1; not supported")
    beta_fast = params.get("beta_fast")
    beta_slow = params.get("beta_slow")
    return RopeConfig(
        theta,
        "yarn",
        factor,
        original,
        beta_fast=float(beta_fast) if beta_fast is not None else None,
        beta_slow=float(beta_slow) if beta_slow is not None else None,
    )


def _longrope(
    theta: float, params: dict[str, Any], config: dict[str, Any], original: int | None
) -> RopeConfig:
    if original is None:
        raise ValueError("longrope scaling needs original_max_position_embeddings")
    long_f = tuple(float(x) for x in params.get("long_factor") or ())
    short_f = tuple(float(x) for x in params.get("short_factor") or ())
    if not long_f or len(long_f) != len(short_f):
        raise ValueError("longrope scaling needs long_factor and short_factor of equal length")
    # As transformers: the context extension is max_position_embeddings / original, and the
    # cos/sin magnitude is sqrt(1 + ln(factor) / ln(original)) unless given.
    factor = float(config.get("max_position_embeddings", original)) / original
    if config.get("original_max_position_embeddings") is None and params.get("factor") is not None:
        factor = float(params["factor"])
    attn = params.get("attention_factor")
    if attn is None:
        attn = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
    return RopeConfig(
        theta,
        "longrope",
        factor,
        original,
        long_factor=long_f,
        short_factor=short_f,
        attention_factor=float(attn),
    )


def _swa_layers(config: dict[str, Any], n_layer: int) -> tuple[bool, ...]:
    """Which layers use sliding-window attention (empty: none)."""
    # Qwen2 configs carry a window size but switch it off with use_sliding_window = false.
    if not config.get("sliding_window") or config.get("use_sliding_window") is False:
        return ()
    layer_types = config.get("layer_types")
    if layer_types:
        if len(layer_types) != n_layer:
            raise ValueError(f"layer_types has {len(layer_types)} entries for {n_layer} layers")
        return tuple(t == "sliding_attention" for t in layer_types)
    pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern"))
    if pattern:
        # Every pattern-th layer is global (Gemma 3: 5 local, 1 global).
        return tuple((i + 1) % int(pattern) != 0 for i in range(n_layer))
    return (True,) * n_layer


def parse_hparams(config: dict[str, Any], tied_default: bool) -> HParams:
    """Read the common transformer hyperparameters (and the optional per-architecture ones)."""
    n_embd = int(_require(config, "hidden_size"))
    n_head = int(_require(config, "num_attention_heads"))
    n_layer = int(_require(config, "num_hidden_layers"))
    head_dim = int(config.get("head_dim") or n_embd // n_head)
    sections = rope_sections(config)
    full = sections.get("full_attention", {})
    rope = parse_rope(full, config)
    partial = full.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0))
    local = sections.get("sliding_attention")
    swa = _swa_layers(config, n_layer)
    return HParams(
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=int(config.get("num_key_value_heads") or n_head),
        head_dim=head_dim,
        n_ff=int(_require(config, "intermediate_size")),
        n_ctx=int(config.get("max_position_embeddings") or 2048),
        rms_eps=float(config.get("rms_norm_eps", 1e-6)),
        rope=rope,
        rope_dim=int(head_dim * float(partial)),
        tied_embeddings=bool(config.get("tie_word_embeddings", tied_default)),
        hidden_act=str(config.get("hidden_act") or config.get("hidden_activation") or "silu"),
        sliding_window=int(config["sliding_window"]) if swa else None,
        swa_layers=swa,
        rope_swa=parse_rope(local, config) if local is not None else None,
        final_logit_softcap=_optional_float(config.get("final_logit_softcapping")),
        attn_logit_softcap=_optional_float(config.get("attn_logit_softcapping")),
        query_pre_attn_scalar=_optional_float(config.get("query_pre_attn_scalar")),
    )


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)
