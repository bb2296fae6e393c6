"""What a GGUF file says about itself, read from its header (no llama.cpp): architecture,
parameter count, file type (quant), trained context length, whether it carries a chat template, and
whether it is one of Outpost's random-weight models (synth.py marks them `outpost.synthetic.shape`).

The model store writes these into each manifest; reading them also proves a download is a whole
GGUF. The header is walked by sizing's reader, which steps over the vocabulary: gguf's GGUFReader
builds a numpy view per token (25 s of CPU for Gemma 3's 262k tokens before `outpost run` said a word).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from outpost.sizing.footprint import read_header

__all__ = ["GGUFInfo", "format_parameters", "read_gguf_info"]


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    parameters: int
    file_type: str  # llama.cpp's name for general.file_type: "Q4_K_M", "F16", ...
    context_length: int | None
    chat_template: bool
    synthetic_shape: str | None = None  # a random-weight model of this shape: its answers are noise


def _file_type_name(value: Any) -> str:
    if value is None:
        return "unknown"
    try:
        name = LlamaFileType(int(value)).name
    except ValueError:
        return f"type {value}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def read_gguf_info(path: Path) -> GGUFInfo:
    """Read the header of the GGUF at `path`; ValueError if it is not a readable, whole GGUF file."""
    meta, tensors = read_header(path)
    arch = str(meta.get("general.architecture") or "unknown")
    context = meta.get(f"{arch}.context_length")
    shape = meta.get("outpost.synthetic.shape")
    return GGUFInfo(
        architecture=arch,
        # Counted from the tensors, so it is right whatever general.size_label says (or if it is absent).
        parameters=sum(t.n_elements for t in tensors.values()),
        file_type=_file_type_name(meta.get("general.file_type")),
        context_length=int(context) if isinstance(context, int) else None,
        chat_template=bool(meta.get("tokenizer.chat_template")),
        synthetic_shape=shape if isinstance(shape, str) else None,
    )


def format_parameters(n: int) -> str:
    """1_711_376_384 -> "1.7B", 134_515_008 -> "135M"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)
