"""`outpost serve` sized from the machine, as a process: under `taskset -c 0` the defaults pick one
thread and say so in the ready line; a request beyond the positions that line names is a 400 that
names the limit; a -c larger than the machine's memory exits 2 before llama.cpp allocates anything."""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
from server_harness import OUTPOST, START_TIMEOUT, assert_openai_error, free_port

READY = re.compile(r"ready: (\d+) slots? x (\d+) positions, .*")


def _wait_ready_line(proc: subprocess.Popen[bytes], log: Path, url: str) -> str:
    """The ready line, once /health is ok (bounded by START_TIMEOUT)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        found = READY.search(log.read_text(errors="replace"))
        try:
            if found and httpx.get(f"{url}/health", timeout=2.0).json()["status"] == "ok":
                return found.group(0)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"no ready line within {START_TIMEOUT} s:\n{log.read_text()}")


@pytest.mark.skipif(
    subprocess.run(["which", "taskset"], capture_output=True).returncode != 0, reason="no taskset"
)
def test_taskset_one_core_sizes_one_thread_and_the_limit_is_a_400(tiny_model: Path, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            ["taskset", "-c", "0", *OUTPOST, "serve", "-m", str(tiny_model), "--port", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        line = _wait_ready_line(proc, log, url)
        # One core: one thread, 4 slots (4 per core), said with where it came from.
        assert ", 1 thread: " in line and "1 usable core (CPU affinity)" in line, line
        assert "auto: slots, ctx, threads" in line and " available (" in line, line
        match = READY.search(line)
        assert match is not None
        slots, positions = int(match.group(1)), int(match.group(2))
        assert slots == 4 and positions == 8192, line  # tiny's trained context fits easily
        assert httpx.get(f"{url}/health", timeout=5.0).json()["slots_total"] == slots
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": positions + 1}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30.0)
        err = assert_openai_error(r, 400, "context_length_exceeded")
        assert f"holds {positions} tokens per request" in err["message"], err
    finally:
        proc.terminate()
        proc.wait(30)


def test_more_kv_than_the_machine_has_exits_2_before_loading(tiny_model: Path) -> None:
    """-c two billion cells of tiny's 2 KiB: ~4 TB, refused with what it needs and what there is."""
    with tempfile.TemporaryDirectory() as home:
        r = subprocess.run(
            [*OUTPOST, "serve", "-m", str(tiny_model), "-c", "2000000000", "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=120,
            env={**__import__("os").environ, "OUTPOST_HOME": home},
        )
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert re.fullmatch(
        r"outpost: error: -c 2000000000 with -np \d+ needs about [\d.]+ GiB \([\d.]+ GiB KV cache at 2048 "
        r"bytes per cell, .*\) but [\d.]+ GiB is available \((host MemAvailable|cgroup v[12] .*)\): "
        r"lower -c or -np, or leave them to auto",
        lines[0],
    ), lines[0]
