"""Reading tensors out of Hugging Face safetensors checkpoints without torch and without loading them.

Owns: parsing the safetensors header (8-byte little-endian length, then JSON), finding a checkpoint's
shard files, and reading a block of rows of one tensor as float32 through a short-lived numpy memmap.
Each read maps only the rows it needs and drops the mapping afterwards, so the converter's resident
memory stays at one block, not at the size of the file (mapped pages count towards RSS while mapped).
bf16 has no numpy dtype: it is read as uint16 and widened to float32 by a 16-bit shift, exactly.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# safetensors dtype -> (numpy dtype read from disk, bytes per element)
_DTYPES: dict[str, tuple[str, int]] = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}
_MAX_HEADER = 100 << 20  # the format caps the header at 100 MB; more means a corrupt file


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor's bytes live: file, absolute byte offset, dtype and shape (row-major)."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def n_rows(self) -> int:
        return self.shape[0] if self.shape else 1

    @property
    def row_elems(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1


def read_header(path: Path) -> list[TensorEntry]:
    """All tensors described by one .safetensors file's header."""
    with open(path, "rb") as f:
        raw_len = f.read(8)
        if len(raw_len) != 8:
            raise ValueError(f"{path} is not a safetensors file (too short)")
        (header_len,) = struct.unpack("<Q", raw_len)
        if header_len > _MAX_HEADER:
            raise ValueError(f"{path} is not a safetensors file (header of {header_len} bytes)")
        header: dict[str, Any] = json.loads(f.read(header_len))
    data_start = 8 + header_len
    file_size = path.stat().st_size
    entries = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = str(info["dtype"])
        if dtype not in _DTYPES:
            raise ValueError(
                f"tensor {name} in {path.name} has dtype {dtype}; outpost convert reads F32, F16 and BF16 "
                "checkpoints (not pre-quantized ones)"
            )
        begin, end = (int(x) for x in info["data_offsets"])
        shape = tuple(int(d) for d in info["shape"])
        if end - begin != int(np.prod(shape, dtype=np.int64)) * _DTYPES[dtype][1]:
            raise ValueError(f"tensor {name} in {path.name}: size does not match its shape")
        if data_start + end > file_size:
            raise ValueError(f"{path} is truncated (an interrupted download?): {name} runs past its end")
        entries.append(TensorEntry(name, path, dtype, shape, data_start + begin))
    return entries


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The checkpoint's shard files: from the index when there is one, else model*.safetensors.

    consolidated*.safetensors (Mistral's own format, shipped beside the HF shards) is never read:
    it holds the same weights under other names.
    """
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(
                f"{model_dir}: shards named in the index are missing: {', '.join(missing)}"
            )
        return files
    files = sorted(model_dir.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no model*.safetensors in {model_dir} (outpost convert reads safetensors checkpoints; "
            "PyTorch .bin files are not supported)"
        )
    return files


def open_checkpoint(model_dir: Path) -> dict[str, TensorEntry]:
    """Every tensor of the checkpoint by its Hugging Face name (headers only; no data is read)."""
    entries: dict[str, TensorEntry] = {}
    for path in checkpoint_files(model_dir):
        for entry in read_header(path):
            if entry.name in entries:
                raise ValueError(f"tensor {entry.name} appears in two shards of {model_dir}")
            entries[entry.name] = entry
    return entries


def read_rows(entry: TensorEntry, row0: int, row1: int) -> npt.NDArray[np.float32]:
    """Rows [row0, row1) of the tensor as a float32 array of shape (rows, row_elems) (1-D: (n,))."""
    disk_dtype, itemsize = _DTYPES[entry.dtype]
    n_rows = row1 - row0
    cols = entry.row_elems
    if n_rows <= 0 or cols == 0:
        return np.zeros((max(n_rows, 0), cols), dtype=np.float32)
    offset = entry.offset + row0 * cols * itemsize
    mapped = np.memmap(entry.path, dtype=disk_dtype, mode="r", offset=offset, shape=(n_rows, cols))
    if entry.dtype == "BF16":
        # bf16 is the top half of a float32: widen exactly by shifting into the high bits (in place).
        wide = mapped.astype(np.uint32)
        wide <<= 16
        out = wide.view(np.float32)
    else:
        out = np.array(mapped, dtype=np.float32)
    del mapped  # the last reference: unmaps now, so these pages stop counting towards RSS
    return out if len(entry.shape) > 1 else out.reshape(-1)
