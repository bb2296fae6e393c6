"""Which GGUF tensors a checkpoint becomes, and streaming each one from safetensors into the file.

Owns: HF -> GGUF names (the `gguf` package's TensorNameMap), the per-tensor transform (llama's Q/K
row permutation, Gemma's norm shift), the output type per tensor (1-D tensors always stay f32, as
llama.cpp wants them) and the byte encoding (f32, f16, bf16, q8_0 through `gguf.quants`).
`StreamedTensor` quacks like the ndarray GGUFWriter.write_tensor_data expects (nbytes, tofile) but
reads, transforms and encodes a block of rows at a time, so memory holds one block, not one model.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np
import numpy.typing as npt
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, get_tensor_name_map
from gguf.quants import quantize

from outpost.models.convert.archs import ArchSpec, extra_tensors
from outpost.models.convert.hparams import HParams
from outpost.models.convert.st_reader import TensorEntry, read_rows

_log = logging.getLogger(__name__)

QT = GGMLQuantizationType
OUTTYPES: dict[str, GGMLQuantizationType] = {"f32": QT.F32, "f16": QT.F16, "bf16": QT.BF16, "q8_0": QT.Q8_0}
_BLOCK_ELEMS = 1 << 22  # ~16 MB of float32 per block read, transformed and written
# HF tensors that carry no weights llama.cpp needs (rotary tables are recomputed from the config).
_SKIP = re.compile(r"(^|\.)rotary_emb\.inv_freq$")
_BLOCK_INDEX = re.compile(r"^blk\.(\d+)\.")


@dataclass(frozen=True)
class TensorJob:
    """One GGUF tensor: its name, numpy-order shape, output type, and where its values come from."""

    name: str
    shape: tuple[int, ...]
    qtype: GGMLQuantizationType
    source: TensorEntry | None = None
    computed: npt.NDArray[np.float32] | None = None  # instead of a source: values from the config
    permute_heads: int = 0  # >0: reorder rows within each of this many heads (rope layout)
    shift: float = 0.0  # added to every value (Gemma norms)

    @property
    def nbytes(self) -> int:
        block_elems, block_bytes = GGML_QUANT_SIZES[self.qtype]  # f32/f16/bf16: blocks of one value
        return int(np.prod(self.shape, dtype=np.int64)) // block_elems * block_bytes

    @property
    def order(self) -> tuple[int, int, str]:
        """File order: token embedding and global tensors, then blocks by index, then the output head."""
        match = _BLOCK_INDEX.match(self.name)
        if match:
            return (1, int(match.group(1)), self.name)
        return (2 if self.name.startswith("output") else 0, 0, self.name)


def output_type(shape: tuple[int, ...], outtype: str) -> GGMLQuantizationType:
    """1-D tensors (norms, biases, rope factors) stay f32; matrices take the requested type.

    q8_0 needs rows that are a multiple of its 32-value block; other rows fall back to f16.
    """
    if len(shape) < 2:
        return QT.F32
    qtype = OUTTYPES[outtype]
    if qtype == QT.Q8_0 and shape[-1] % 32:
        _log.info("row length %d is not a multiple of 32: kept at f16", shape[-1])
        return QT.F16
    return qtype


def plan_tensors(
    checkpoint: dict[str, TensorEntry], spec: ArchSpec, hp: HParams, outtype: str
) -> list[TensorJob]:
    """Every tensor of the output file, in file order."""
    name_map = get_tensor_name_map(spec.arch, hp.n_layer)
    jobs: list[TensorJob] = []
    unmapped: list[str] = []
    has_output = False
    for hf_name, entry in checkpoint.items():
        if _SKIP.search(hf_name):
            continue
        name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            unmapped.append(hf_name)
            continue
        if name == "output.weight":
            if hp.tied_embeddings:
                continue  # tied: llama.cpp reuses token_embd for the output projection
            has_output = True
        jobs.append(_job(name, hf_name, entry, spec, hp, outtype))
    if unmapped:
        shown = ", ".join(unmapped[:5]) + (f" and {len(unmapped) - 5} more" if len(unmapped) > 5 else "")
        raise ValueError(f"{spec.hf_name}: no GGUF name for tensor(s) {shown}")
    if not hp.tied_embeddings and not has_output:
        _log.warning("untied model without lm_head.weight: the output projection reuses the embedding")
    for name, values in extra_tensors(spec, hp):
        jobs.append(TensorJob(name, values.shape, QT.F32, computed=values))
    _check_required(jobs, spec)
    return sorted(jobs, key=lambda job: job.order)


def _job(name: str, hf_name: str, entry: TensorEntry, spec: ArchSpec, hp: HParams, outtype: str) -> TensorJob:
    heads = 0
    if spec.permute_qk and re.search(r"\.attn_[qk]\.(weight|bias)$", name):
        heads = hp.n_head if ".attn_q." in name else hp.n_head_kv
        if entry.n_rows != heads * hp.head_dim:
            raise ValueError(f"{hf_name}: {entry.n_rows} rows, expected {heads} heads x {hp.head_dim}")
    shift = spec.norm_shift if hf_name.endswith("norm.weight") else 0.0
    return TensorJob(name, entry.shape, output_type(entry.shape, outtype), entry, None, heads, shift)


def _check_required(jobs: list[TensorJob], spec: ArchSpec) -> None:
    names = {job.name for job in jobs}
    for required in ("token_embd.weight", "output_norm.weight"):
        if required not in names:
            raise ValueError(f"{spec.hf_name}: the checkpoint has no tensor for {required}")


def permute_rows(block: npt.NDArray[np.float32], n_heads: int) -> npt.NDArray[np.float32]:
    """HF's per-head [first half | second half] rotary layout -> llama.cpp's interleaved pairs.

    Row j of a head's first half and row j of its second half form rotary pair j; llama.cpp wants
    them at rows 2j and 2j+1. `block` holds whole heads (1-D biases are treated as one column).
    """
    rows = block.shape[0]
    head_dim = rows // n_heads
    tail = block.shape[1:]
    return block.reshape(n_heads, 2, head_dim // 2, *tail).swapaxes(1, 2).reshape(block.shape)


class StreamedTensor:
    """Reads, transforms and encodes one tensor block by block while GGUFWriter writes it."""

    def __init__(self, job: TensorJob) -> None:
        self.job = job
        self.nbytes = job.nbytes

    def _rows_per_block(self, row_elems: int, n_rows: int) -> int:
        rows = max(1, _BLOCK_ELEMS // max(row_elems, 1))
        if self.job.permute_heads:
            head_rows = n_rows // self.job.permute_heads  # blocks must hold whole heads
            rows = max(head_rows, rows // head_rows * head_rows)
        return rows

    def _blocks(self) -> Iterator[npt.NDArray[np.float32]]:
        job = self.job
        if job.computed is not None:
            yield job.computed
            return
        assert job.source is not None
        entry = job.source
        step = self._rows_per_block(entry.row_elems, entry.n_rows)
        for r0 in range(0, entry.n_rows, step):
            block = read_rows(entry, r0, min(r0 + step, entry.n_rows))
            if job.permute_heads:
                block = permute_rows(block, len(block) * job.permute_heads // entry.n_rows)
            yield block.reshape(-1, *entry.shape[1:])

    def tofile(self, fp: IO[bytes]) -> None:
        written = 0
        for block in self._blocks():
            if self.job.shift:
                block = block + np.float32(self.job.shift)
            encoded = quantize(np.ascontiguousarray(block, dtype=np.float32), self.job.qtype)
            encoded.tofile(fp)
            written += encoded.nbytes
        if written != self.nbytes:
            raise RuntimeError(f"{self.job.name}: wrote {written} bytes, expected {self.nbytes}")
