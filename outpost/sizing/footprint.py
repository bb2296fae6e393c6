"""What a model costs in memory, read from its GGUF header (no llama.cpp).

The weights cost their file size (llama.cpp maps the file; every page is read while decoding, so
all of it ends up resident); where layers go to a GPU, each block's tensors and the output layer's
are summed from the tensor table that follows the metadata (sizing/offload.py). The KV cache
costs, per cell (one position of one sequence), a key and a value vector per layer and KV head:
n_layer * n_head_kv * (key_length + value_length) * bytes per element (2 for f16, llama.cpp's
default cache type).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf.constants import GGML_QUANT_SIZES, GGUF_MAGIC, GGMLQuantizationType

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
    layer_bytes: tuple[int, ...] = ()  # weight bytes of each block (blk.N.*), when read
    output_bytes: int = 0  # the output layer's weights (output.weight or the tied embedding, norm)

    def kv_bytes_per_cell(self, kv_type: str = "f16") -> int:
        """KV cache bytes one position of one sequence takes, over all layers."""
        per_element = KV_TYPE_BYTES[kv_type]
        return int(self.kv_heads_total * (self.key_length + self.value_length) * per_element + 0.5)


# struct formats of GGUF's scalar value types (little-endian files; GGUFValueType's numbering).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class _HeaderWalk:
    """The metadata section of a GGUF, walked with struct over a memory map. gguf's GGUFReader
    builds a numpy view per array item: 40 s for a 49k-token vocabulary on a loaded 2-core VM,
    where this takes milliseconds. Arrays are read as their length, except short integer ones."""

    def __init__(self, data: mmap.mmap) -> None:
        self.data = data
        self.pos = 0
        self.n_tensors = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from("<" + fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        self.pos += n
        return bytes(self.data[self.pos - n : self.pos]).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown GGUF value type {kind}")
        item, count = self.take("I"), self.take("Q")
        if item in _SCALARS:
            if item not in (6, 12) and count <= 4096:  # per-layer integers, e.g. head_count_kv
                return [self.value(item) for _ in range(count)]
            self.pos += struct.calcsize("<" + _SCALARS[item]) * count
        elif item == _STRING:
            for _ in range(count):  # a vocabulary: step over each length-prefixed string
                length = self.take("Q")
                self.pos += length
        else:
            for _ in range(count):
                self.value(item)
        return _Length(count)

    def metadata(self) -> dict[str, Any]:
        if self.take("I") != GGUF_MAGIC:
            raise ValueError("no GGUF magic")
        if self.take("I") < 2:
            raise ValueError("GGUF version 1 is not supported")
        self.n_tensors = self.take("Q")
        n_kv = self.take("Q")
        found: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self.string()
            found[key] = self.value(self.take("I"))
        return found

    def tensors(self, alignment: int) -> dict[str, Tensor]:
        """Each tensor's elements and bytes, from the table after the metadata (call metadata() first);
        ValueError when the file ends before the last tensor's data (a cut download)."""
        table: dict[str, Tensor] = {}
        data_end = 0
        for _ in range(self.n_tensors):
            name = self.string()
            dims = tuple(self.take("Q") for _ in range(self.take("I")))
            elements = math.prod(dims)
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.take("I"))]
            table[name] = Tensor(elements, elements // block * size, dims)
            data_end = max(data_end, self.take("Q") + table[name].n_bytes)
        end = -(-self.pos // alignment) * alignment + data_end  # the data section starts aligned
        if end > len(self.data):
            raise ValueError(f"the file ends at byte {len(self.data)}, its tensors at {end}")
        return table


@dataclass(frozen=True)
class _Length:
    """An array read only for its length."""

    count: int


@dataclass(frozen=True)
class Tensor:
    """One entry of a GGUF's tensor table."""

    n_elements: int
    n_bytes: int
    dims: tuple[int, ...] = ()  # ggml's order: dims[0] is a row's length


def _positive(value: Any, what: str, path: Path) -> int:
    if isinstance(value, int) and value > 0:
        return value
    raise ValueError(f"{path}: the GGUF header has no usable {what} (read {value!r})")


def _first_int(value: Any) -> int:
    """An int, or the largest of a per-layer list of them; 0 when absent."""
    if isinstance(value, list):
        return max((int(v) for v in value), default=0)
    return int(value or 0)


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """A GGUF's metadata keys (arrays longer than per-layer lists come back as their length only)
    and its tensor table; ValueError if it is not a readable, whole GGUF file."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            walk = _HeaderWalk(data)
            meta = walk.metadata()
            alignment = meta.get("general.alignment", 32)
            return meta, walk.tensors(alignment if isinstance(alignment, int) and alignment > 0 else 32)
    except (ValueError, OSError, struct.error, UnicodeDecodeError, KeyError) as exc:
        raise ValueError(f"{path} is not a readable GGUF file ({exc})") from exc


_BLOCK_TENSOR = re.compile(r"blk\.(\d+)\.")


def _layer_sizes(tensors: dict[str, int], n_layer: int) -> tuple[tuple[int, ...], int]:
    """Weight bytes per block, and the output layer's (its own matrix, else the tied embedding)."""
    blocks = [0] * n_layer
    for name, size in tensors.items():
        match = _BLOCK_TENSOR.match(name)
        if match and int(match.group(1)) < n_layer:
            blocks[int(match.group(1))] += size
    output = tensors.get("output.weight", tensors.get("token_embd.weight", 0))
    return tuple(blocks), output + tensors.get("output_norm.weight", 0)


def read_footprint(path: Path) -> ModelFootprint:
    """Read the header of the GGUF at `path`; ValueError if it lacks what sizing needs."""
    meta, table = read_header(path)
    tensors = {name: tensor.n_bytes for name, tensor in table.items()}
    arch = str(meta.get("general.architecture") or "")

    def key(name: str) -> Any:
        return meta.get(f"{arch}.{name}")

    n_layer = _positive(key("block_count"), "block_count", path)
    n_embd = _positive(key("embedding_length"), "embedding_length", path)
    # Attention-free (recurrent) models have no heads and no KV cache to size.
    n_head = _first_int(key("attention.head_count"))
    kv_heads = key("attention.head_count_kv")
    if isinstance(kv_heads, list):  # one entry per layer
        kv_heads_total = sum(int(h) for h in kv_heads)
    else:
        kv_heads_total = n_layer * (int(kv_heads) if kv_heads else n_head)
    head_dim = n_embd // n_head if n_head else 0
    tokens = meta.get("tokenizer.ggml.tokens")
    layer_bytes, output_bytes = _layer_sizes(tensors, n_layer) if tensors else ((), 0)
    return ModelFootprint(
        file_bytes=path.stat().st_size,
        n_layer=n_layer,
        kv_heads_total=kv_heads_total,
        n_head=n_head,
        key_length=int(key("attention.key_length") or head_dim),
        value_length=int(key("attention.value_length") or head_dim),
        n_embd=n_embd,
        n_vocab=tokens.count if isinstance(tokens, _Length) else int(key("vocab_size") or 0),
        n_ctx_train=int(key("context_length") or 0),
        layer_bytes=layer_bytes,
        output_bytes=output_bytes,
    )


__all__ = ["KV_TYPE_BYTES", "ModelFootprint", "read_footprint"]
