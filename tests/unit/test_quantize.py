"""outpost.engine.quantize: argument checking and llama.cpp failure reporting (no model needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("llama_cpp")

from outpost.engine.quantize import QUANT_TYPES, quantize_gguf


def test_unknown_type_lists_valid_types(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(b"x")
    with pytest.raises(ValueError, match="q4_K_M") as err:
        quantize_gguf(src, tmp_path / "out.gguf", "q4_weird")
    assert all(name in str(err.value) for name in QUANT_TYPES)


def test_refuses_in_place_and_missing_source(tmp_path: Path) -> None:
    src = tmp_path / "m.gguf"
    src.write_bytes(b"x")
    with pytest.raises(ValueError, match="in place"):
        quantize_gguf(src, tmp_path / "." / "m.gguf", "q8_0")
    with pytest.raises(FileNotFoundError):
        quantize_gguf(tmp_path / "missing.gguf", tmp_path / "out.gguf", "q8_0")


def test_case_insensitive_names_and_failure_is_runtime_error(tmp_path: Path) -> None:
    src = tmp_path / "not-a-model.gguf"
    src.write_bytes(b"definitely not GGUF")
    with pytest.raises(RuntimeError, match="failed to quantize"):
        quantize_gguf(src, tmp_path / "out.gguf", "Q4_K_M", n_threads=1)
    assert not (tmp_path / "out.gguf").exists()
