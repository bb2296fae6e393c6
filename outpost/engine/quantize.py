"""GGUF quantization through llama.cpp's own quantizer (llama_model_quantize).

Owns the mapping from quant names ("q4_K_M") to llama.cpp file types and the call itself; reaches
llama.cpp only through outpost.engine.lib. Per-tensor progress is read from the quantizer's log lines
("[  12/ 273] blk.0.attn_q.weight - ..."), the only place llama.cpp reports it.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable
from pathlib import Path

from outpost.engine.lib import capture_log_lines, ensure_backend, llama, recent_problems

__all__ = ["QUANT_TYPES", "canonical_quant_type", "quantize_gguf"]

# Quant name -> llama.cpp ftype constant name. Names follow llama-quantize's spelling; lookup is
# case-insensitive so "Q4_K_M" and "q4_k_m" both work.
QUANT_TYPES: dict[str, str] = {
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    "q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
    "q5_0": "LLAMA_FTYPE_MOSTLY_Q5_0",
    "q5_1": "LLAMA_FTYPE_MOSTLY_Q5_1",
    "q5_K_S": "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    "q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "q4_K_S": "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    "q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "q3_K_S": "LLAMA_FTYPE_MOSTLY_Q3_K_S",
    "q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "q3_K_L": "LLAMA_FTYPE_MOSTLY_Q3_K_L",
    "q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
}
_TENSOR_LINE = re.compile(r"^\[\s*(\d+)/\s*(\d+)\]\s+(\S+)")

QuantProgress = Callable[[int, int, str], None]


def canonical_quant_type(qtype: str) -> str:
    """The QUANT_TYPES spelling of `qtype`, matched case-insensitively; ValueError listing the valid ones."""
    by_lower = {name.lower(): name for name in QUANT_TYPES}
    name = by_lower.get(qtype.lower())
    if name is None:
        raise ValueError(f"unknown quant type {qtype!r}; valid: {', '.join(QUANT_TYPES)}")
    return name


def _ftype(qtype: str) -> int:
    return int(getattr(llama, QUANT_TYPES[canonical_quant_type(qtype)]))


def quantize_gguf(
    src: Path,
    dst: Path,
    qtype: str,
    n_threads: int | None = None,
    progress: QuantProgress | None = None,
    allow_requantize: bool = False,
) -> None:
    """Quantize the GGUF at `src` into `dst` as `qtype` (see QUANT_TYPES).

    n_threads defaults to all CPUs. allow_requantize: accept a quantized `src` (dequantized, then
    converted; the result is never better than `src`). `progress(done, total, tensor_name)` is
    called per tensor.
    Raises ValueError for an unknown type or src == dst, FileNotFoundError for a missing src,
    RuntimeError when llama.cpp reports failure.
    """
    ftype = _ftype(qtype)
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"no such model file: {src}")
    if src.resolve() == dst.resolve():
        raise ValueError(f"refusing to quantize {src} in place: choose a different output path")
    if n_threads is not None and n_threads < 1:
        raise ValueError("n_threads must be >= 1")
    ensure_backend()
    params = llama.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = n_threads or os.cpu_count() or 1
    params.allow_requantize = allow_requantize  # llama.cpp refuses quantized inputs without it

    def on_line(line: str) -> None:
        match = _TENSOR_LINE.match(line)
        if match and progress is not None:
            progress(int(match.group(1)), int(match.group(2)), match.group(3))

    with capture_log_lines(on_line):
        rc = llama.llama_model_quantize(os.fsencode(src), os.fsencode(dst), ctypes.byref(params))
    if rc != 0:
        dst.unlink(missing_ok=True)  # llama.cpp may leave a truncated file behind
        detail = recent_problems()
        raise RuntimeError(
            f"llama.cpp failed to quantize {src} to {qtype} (code {rc})" + (f": {detail}" if detail else "")
        )
