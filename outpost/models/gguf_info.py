"""What a GGUF file says about itself, read with the `gguf` package (no llama.cpp): architecture,
parameter count, file type (quant), trained context length, whether it carries a chat template, and
whether it is one of Outpost's random-weight models (synth.py marks them `outpost.synthetic.shape`).

The model store writes these into each manifest; reading them also proves a download is a GGUF.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader, LlamaFileType

__all__ = ["GGUFInfo", "format_parameters", "read_gguf_info"]


@dataclass(frozen=True)
class GGUFInfo:
    architecture: str
    parameters: int
    file_type: str  # llama.cpp's name for general.file_type: "Q4_K_M", "F16", ...
    context_length: int | None
    chat_template: bool
    synthetic_shape: str | None = None  # a random-weight model of this shape: its answers are noise


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    return None if field is None else field.contents()


def _file_type_name(value: Any) -> str:
    if value is None:
        return "unknown"
    try:
        name = LlamaFileType(int(value)).name
    except ValueError:
        return f"type {value}"
    return name.removeprefix("MOSTLY_").removeprefix("ALL_")


def read_gguf_info(path: Path) -> GGUFInfo:
    """Read the header of the GGUF at `path`; ValueError if it is not a readable GGUF file."""
    try:
        reader = GGUFReader(path, "r")
    except (ValueError, OSError, IndexError) as exc:  # the reader raises these on a bad magic / short file
        raise ValueError(f"{path} is not a readable GGUF file ({exc})") from exc
    arch = str(_field(reader, "general.architecture") or "unknown")
    context = _field(reader, f"{arch}.context_length")
    return GGUFInfo(
        architecture=arch,
        # Counted from the tensors, so it is right whatever general.size_label says (or if it is absent).
        parameters=sum(int(t.n_elements) for t in reader.tensors),
        file_type=_file_type_name(_field(reader, "general.file_type")),
        context_length=int(context) if context is not None else None,
        chat_template=bool(_field(reader, "tokenizer.chat_template")),
        synthetic_shape=_field(reader, "outpost.synthetic.shape"),
    )


def format_parameters(n: int) -> str:
    """1_711_376_384 -> "1.7B", 134_515_008 -> "135M"."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)
