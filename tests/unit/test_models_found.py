"""Which models `outpost serve` serves without -m: every GGUF of --models-dir by its stem (a split one
by its first part's name), or every stored model whose file is there, by its store name."""

from __future__ import annotations

from pathlib import Path

import pytest

from outpost.commands.models import models_in_dir, models_in_store


def test_a_models_dir_names_each_gguf_by_its_stem(tmp_path: Path) -> None:
    for name in ("chat.gguf", "big-00001-of-00002.gguf", "big-00002-of-00002.gguf", "notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "nested.gguf").write_bytes(b"")  # only files directly in the folder
    found = models_in_dir(str(tmp_path))
    assert found == {"big": str(tmp_path / "big-00001-of-00002.gguf"), "chat": str(tmp_path / "chat.gguf")}


def test_an_empty_models_dir_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no \.gguf file in it"):
        models_in_dir(str(tmp_path))


def test_an_empty_store_serves_nothing_from_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    assert models_in_store() == {}
