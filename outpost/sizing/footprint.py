"""What a model costs in memory, read from its GGUF header with the `gguf` package (no llama.cpp).

The weights cost their file size (llama.cpp maps the file; every page is read while decoding, so
all of it ends up resident). The KV cache costs, per cell (one position of one sequence), a key
and a value vector per layer and KV head: n_layer * n_head_kv * (key_length + value_length) *
bytes per element (2 for f16, llama.cpp's default cache type).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bytes per K/V element for llama.cpp's cache types (q8_0: 34-byte blocks of 32 values).
KV_TYPE_BYTES = {"f16": 2.0, "f32": 4.0, "q8_0": 34 / 32}


@dataclass(frozen=True)
class ModelFootprint:
    """The figures sizing needs from a GGUF header."""

    file_bytes: int
    n_layer: int
    kv_heads_total: int  # n_head_kv summed over layers (some models vary it per layer)
    n_head: int
    key_length: int
    value_length: int
    n_embd: int
    n_vocab: int
    n_ctx_train: int  # 0 when the header does not say

    def kv_bytes_per_cell(self, kv_type: str = "f16") -> int:
        """KV cache bytes one position of one sequence takes, over all layers."""
        per_element = KV_TYPE_BYTES[kv_type]
        return int(self.kv_heads_total * (self.key_length + self.value_length) * per_element + 0.5)


def _field(reader: Any, key: str) -> Any:
    found = reader.get_field(key)
    return None if found is None else found.contents()


def _positive(value: Any, what: str, path: Path) -> int:
    if isinstance(value, int) and value > 0:
        return value
    raise ValueError(f"{path}: the GGUF header has no usable {what} (read {value!r})")


def _first_int(value: Any) -> int:
    """An int, or the largest of a per-layer list of them; 0 when absent."""
    if isinstance(value, list):
        return max((int(v) for v in value), default=0)
    return int(value or 0)


def read_footprint(path: Path) -> ModelFootprint:
    """Read the header of the GGUF at `path`; ValueError if it lacks what sizing needs."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(path, "r")
    except (ValueError, OSError, IndexError) as exc:  # the reader's errors for a bad or short file
        raise ValueError(f"{path} is not a readable GGUF file ({exc})") from exc
    arch = str(_field(reader, "general.architecture") or "")
    n_layer = _positive(_field(reader, f"{arch}.block_count"), "block_count", path)
    n_embd = _positive(_field(reader, f"{arch}.embedding_length"), "embedding_length", path)
    # Attention-free (recurrent) models have no heads and no KV cache to size.
    n_head = _first_int(_field(reader, f"{arch}.attention.head_count"))
    kv_heads = _field(reader, f"{arch}.attention.head_count_kv")
    if isinstance(kv_heads, list):  # one entry per layer
        kv_heads_total = sum(int(h) for h in kv_heads)
    else:
        kv_heads_total = n_layer * (int(kv_heads) if kv_heads else n_head)
    head_dim = n_embd // n_head if n_head else 0
    tokens = reader.get_field("tokenizer.ggml.tokens")
    context = _field(reader, f"{arch}.context_length")
    return ModelFootprint(
        file_bytes=path.stat().st_size,
        n_layer=n_layer,
        kv_heads_total=kv_heads_total,
        n_head=n_head,
        key_length=int(_field(reader, f"{arch}.attention.key_length") or head_dim),
        value_length=int(_field(reader, f"{arch}.attention.value_length") or head_dim),
        n_embd=n_embd,
        n_vocab=len(tokens.data) if tokens is not None else int(_field(reader, f"{arch}.vocab_size") or 0),
        n_ctx_train=int(context) if context else 0,
    )


__all__ = ["KV_TYPE_BYTES", "ModelFootprint", "read_footprint"]
