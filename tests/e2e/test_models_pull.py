"""`outpost pull`, `models list|show|rm` and `-m NAME` as a user runs them, against the fake hub.

The catalog's real repo ids are served by the fake hub (HF_ENDPOINT), with the tiny synthetic model
under the real file names, so these runs take the same code path as a pull from huggingface.co.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fakehub import FakeHub

from outpost.models.catalog import parse_model_ref

OUTPOST = [sys.executable, "-m", "outpost.cli"]
SMOL = parse_model_ref("smollm2:135m").entry
assert SMOL is not None
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes downloads in 10 MiB chunks: resume points are multiples


def _outpost(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "OUTPOST_HOME": str(home), **(env or {})}
    return subprocess.run(
        [*OUTPOST, *args], capture_output=True, text=True, timeout=180, env=full_env, stdin=subprocess.DEVNULL
    )


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    return lines[-1]


def _store_is_empty(home: Path) -> None:
    """No manifest, no model file: nothing a user or `-m` could mistake for a model."""
    models = home / "models"
    assert not list(models.glob("manifests/*.json"))
    assert not list(models.glob("gguf/**/*.gguf"))


@pytest.fixture(scope="session")
def tiny_q4km(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from outpost.models import write_synthetic_model

    path = tmp_path_factory.mktemp("models") / "tiny-q4_K_M.gguf"
    return write_synthetic_model("tiny", path, quant="q4_K_M", seed=0)


@pytest.fixture
def smol_hub(fake_hub: FakeHub, tiny_model: Path, tiny_q4km: Path) -> FakeHub:
    """smollm2:135m's real repo on the fake hub: q4_K_M and f16 (15 MB, > one download chunk)."""
    assert SMOL is not None
    files = {SMOL.filename("q4_K_M"): tiny_q4km, SMOL.filename("f16"): tiny_model, "README.md": b"# tiny"}
    fake_hub.add_repo(SMOL.repo, files)
    return fake_hub


def test_pull_by_catalog_name_list_show_run_rm(smol_hub: FakeHub, tiny_q4km: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = _outpost(home, "pull", "smollm2:135m", env={"TQDM_POSITION": "-1"})  # force bars onto the pipe
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.name == "SmolLM2-135M-Instruct-Q4_K_M.gguf" and _sha256(path) == _sha256(tiny_q4km)
    assert "SmolLM2-135M-Instruct-Q4_K_M.gguf" in r.stderr and "100%" in r.stderr  # the download bar
    assert "sha256 verified" in r.stderr

    listing = _outpost(home, "models", "list")
    assert listing.returncode == 0
    header, row = listing.stdout.splitlines()
    assert header.split() == ["NAME", "PARAMS", "QUANT", "SIZE", "ARCH", "CONTEXT", "SOURCE", "SHA256"]
    source, checksum = f"hub:{SMOL.repo}", _sha256(tiny_q4km)[:12]
    assert row.split() == [
        "smollm2:135m-q4_K_M",
        "7.3M",
        "q4_K_M",
        "5.1",
        "MB",
        "llama",
        "8192",
        source,
        checksum,
    ]

    shown = json.loads(_outpost(home, "models", "show", "smollm2:135m").stdout)
    assert shown["sha256"] == _sha256(tiny_q4km) and shown["verified"] == "sha256"
    assert (shown["source"], shown["catalog"]) == ("hub", "smollm2:135m")
    assert shown["revision"] == smol_hub.repos[SMOL.repo].commit and shown["source_repo"] == SMOL.repo
    assert (shown["file_type"], shown["quant"], shown["architecture"]) == ("Q4_K_M", "q4_K_M", "llama")
    assert shown["chat_template"] is True and shown["context_length"] == 8192 and Path(shown["path"]) == path

    run = _outpost(home, "run", "-m", "smollm2:135m", "-p", "hi", "-n", "4", "--single-turn")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip()

    gets = len(smol_hub.file_gets())
    again = _outpost(home, "pull", "smollm2:135m")
    assert again.returncode == 0 and "up to date" in again.stderr
    assert len(smol_hub.file_gets()) == gets  # nothing downloaded twice

    rm = _outpost(home, "models", "rm", "smollm2:135m")
    assert rm.returncode == 0 and "smollm2:135m-q4_K_M" in rm.stdout
    assert not path.exists()
    _store_is_empty(home)
    gone = _outpost(home, "run", "-m", "smollm2:135m", "-p", "hi", "-n", "4", "--single-turn")
    assert gone.returncode == 2 and "outpost pull smollm2:135m" in _one_error_line(gone)


def test_pull_by_repo_and_quant(fake_hub: FakeHub, tiny_model: Path, tiny_q4km: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    fake_hub.add_repo("acme/tiny-GGUF", {"tiny-F16.gguf": tiny_model, "tiny-Q4_K_M.gguf": tiny_q4km})
    r = _outpost(home, "pull", "acme/tiny-GGUF:F16")
    assert r.returncode == 0, r.stderr
    assert _sha256(Path(r.stdout.strip())) == _sha256(tiny_model)
    shown = json.loads(_outpost(home, "models", "show", "acme/tiny-GGUF:f16").stdout)
    assert (shown["name"], shown["file"], shown["file_type"]) == (
        "acme/tiny-GGUF:f16",
        "tiny-F16.gguf",
        "F16",
    )
    run = _outpost(home, "run", "-m", "acme/tiny-GGUF:f16", "-p", "hi", "-n", "4", "--single-turn")
    assert run.returncode == 0, run.stderr

    missing = _outpost(home, "pull", "acme/tiny-GGUF:Q5_K_M")
    assert missing.returncode == 2
    assert "no q5_K_M GGUF; available: f16, q4_K_M" in _one_error_line(missing)


def test_resume_within_one_pull_after_a_dropped_connection(
    smol_hub: FakeHub, tiny_model: Path, tmp_path: Path
) -> None:
    smol_hub.cut_downloads(after_bytes=CHUNK + 1_000_000)
    r = _outpost(tmp_path / "home", "pull", "smollm2:135m-f16")
    assert r.returncode == 0, r.stderr
    assert _sha256(Path(r.stdout.strip())) == _sha256(tiny_model)
    first, second = smol_hub.file_gets()
    assert (first.range, first.body_bytes) == (None, CHUNK + 1_000_000)
    assert second.range == f"bytes={CHUNK}-" and second.status == 206
    assert second.body_bytes == tiny_model.stat().st_size - CHUNK


def test_interrupted_pull_leaves_no_model_and_the_next_pull_resumes(
    smol_hub: FakeHub, tiny_model: Path, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    smol_hub.cut_downloads(after_bytes=CHUNK + 1_000_000)
    smol_hub.fail_downloads(503)  # the client's own retry fails too: the pull gives up
    r = _outpost(home, "pull", "smollm2:135m-f16")
    assert r.returncode == 1
    assert f"{CHUNK} of {tiny_model.stat().st_size} bytes kept" in _one_error_line(r)
    _store_is_empty(home)
    assert _outpost(home, "models", "list").stdout.splitlines()[1:] == []
    assert _outpost(home, "run", "-m", "smollm2:135m-f16", "-p", "hi", "--single-turn").returncode == 2

    gets_before = len(smol_hub.file_gets())
    r = _outpost(home, "pull", "smollm2:135m-f16")
    assert r.returncode == 0, r.stderr
    assert f"resuming SmolLM2-135M-Instruct-f16.gguf at {CHUNK}" in r.stderr
    (resumed,) = smol_hub.file_gets()[gets_before:]
    assert resumed.range == f"bytes={CHUNK}-" and resumed.status == 206
    assert resumed.body_bytes == tiny_model.stat().st_size - CHUNK
    assert _sha256(Path(r.stdout.strip())) == _sha256(tiny_model)
    assert not list((home / "models" / ".partial").glob("*.part"))


def test_checksum_mismatch_is_discarded(smol_hub: FakeHub, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert SMOL is not None
    smol_hub.corrupt(SMOL.repo, SMOL.filename("q4_K_M"))
    r = _outpost(home, "pull", "smollm2:135m")
    assert r.returncode == 1
    line = _one_error_line(r)
    assert "sha256 mismatch" in line and "discarded" in line
    _store_is_empty(home)
    assert not list((home / "models" / ".partial").glob("*.part"))


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("nobody/no-such-repo-GGUF", "no Hugging Face repo 'nobody/no-such-repo-GGUF'"),
        ("gpt9:1b", "unknown model 'gpt9'"),
        ("smollm2:135m-q3_K_S", "has no q3_K_S GGUF; available: f16, q4_K_M"),
    ],
)
def test_bad_names_exit_2_with_one_line(smol_hub: FakeHub, tmp_path: Path, name: str, needle: str) -> None:
    r = _outpost(tmp_path / "home", "pull", name)
    assert r.returncode == 2, r.stderr
    assert needle in _one_error_line(r)
    _store_is_empty(tmp_path / "home")


def test_gated_repo_needs_hf_token(fake_hub: FakeHub, tiny_q4km: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    fake_hub.add_repo("acme/gated-GGUF", {"gated-Q4_K_M.gguf": tiny_q4km}, token="hf_test_token")
    denied = _outpost(home, "pull", "acme/gated-GGUF")
    assert denied.returncode == 2 and "gated" in _one_error_line(denied) and "HF_TOKEN" in denied.stderr
    r = _outpost(home, "pull", "acme/gated-GGUF", env={"HF_TOKEN": "hf_test_token"})
    assert r.returncode == 0, r.stderr
    assert _sha256(Path(r.stdout.strip())) == _sha256(tiny_q4km)
    hub_heads = [q for q in fake_hub.requests if q.server == "hub" and q.method == "HEAD"]
    assert hub_heads[-1].authorized and hub_heads[-1].status == 302
    assert not fake_hub.file_gets()[-1].authorized  # the token is not sent on to the CDN


@pytest.mark.parametrize("how", ["flag", "env"])
def test_serve_with_a_name_not_pulled_exits_2_without_downloading(
    fake_hub: FakeHub, tmp_path: Path, how: str
) -> None:
    """-m and OUTPOST_MODEL_PATH both take a store name (or a path); neither ever downloads."""
    if how == "flag":
        r = _outpost(tmp_path / "home", "serve", "-m", "smollm2:360m", "--port", "1")
    else:
        r = _outpost(tmp_path / "home", "serve", "--port", "1", env={"OUTPOST_MODEL_PATH": "smollm2:360m"})
    assert r.returncode == 2
    assert "download it first: outpost pull smollm2:360m" in _one_error_line(r)
    assert fake_hub.requests == []
