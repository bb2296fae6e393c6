"""The fake hub answers huggingface_hub's own download paths (what the converter and pull rely on)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from fakehub import FakeHub

FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "tokenizer.json": b'{"model": {}}',
    "model-00001-of-00002.safetensors": bytes(range(256)) * 400,
    "model-00002-of-00002.safetensors": bytes(range(255, -1, -1)) * 300,
    "nested/extra.txt": b"nested file",
}


def test_snapshot_download_fetches_every_file(fake_hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import snapshot_download

    fake_hub.add_repo("acme/tiny-hf", FILES)
    out = Path(snapshot_download("acme/tiny-hf", endpoint=fake_hub.url, local_dir=tmp_path / "snap"))
    for name, data in FILES.items():
        assert (out / name).read_bytes() == data, name
    lfs_gets = [r for r in fake_hub.requests if r.server == "cdn" and r.method == "GET"]
    assert len(lfs_gets) == 2 and all(not r.authorized for r in lfs_gets)  # safetensors via the "CDN"


def test_allow_patterns_and_tree_listing(fake_hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import HfApi, snapshot_download

    repo = fake_hub.add_repo("acme/tiny-hf", FILES)
    out = Path(
        snapshot_download(
            "acme/tiny-hf", endpoint=fake_hub.url, local_dir=tmp_path / "s", allow_patterns=["*.json"]
        )
    )
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "tokenizer.json",
    ]
    api = HfApi(endpoint=fake_hub.url)
    top = {(e.path, type(e).__name__) for e in api.list_repo_tree("acme/tiny-hf")}
    assert ("nested", "RepoFolder") in top and ("nested/extra.txt", "RepoFile") not in top
    info = api.model_info("acme/tiny-hf", files_metadata=True)
    assert info.sha == repo.commit
    shard = next(s for s in info.siblings or [] if s.rfilename.endswith("1-of-00002.safetensors"))
    assert shard.lfs is not None
    assert shard.lfs.sha256 == hashlib.sha256(FILES["model-00001-of-00002.safetensors"]).hexdigest()


def test_errors_match_the_real_hub(fake_hub: FakeHub, tmp_path: Path) -> None:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import GatedRepoError, RemoteEntryNotFoundError, RepositoryNotFoundError

    fake_hub.add_repo("acme/tiny-hf", FILES)
    fake_hub.add_repo("acme/gated", {"config.json": b"{}"}, token="hf_secret")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("acme/missing", "config.json", endpoint=fake_hub.url, local_dir=tmp_path / "a")
    with pytest.raises(RemoteEntryNotFoundError):
        hf_hub_download("acme/tiny-hf", "nope.json", endpoint=fake_hub.url, local_dir=tmp_path / "b")
    with pytest.raises(GatedRepoError):
        hf_hub_download(
            "acme/gated", "config.json", endpoint=fake_hub.url, local_dir=tmp_path / "c", token=False
        )
    path = hf_hub_download(
        "acme/gated", "config.json", endpoint=fake_hub.url, local_dir=tmp_path / "d", token="hf_secret"
    )
    assert Path(path).read_bytes() == b"{}"
