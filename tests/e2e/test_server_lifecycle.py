"""`outpost serve` as a process: bad flags exit 2, SIGTERM drains in-flight work and exits 0."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
from server_harness import OUTPOST, Server, assert_openai_error, sse_events


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*OUTPOST, "serve", *args], capture_output=True, text=True, timeout=60)


def test_bad_flags_and_missing_model_exit_2_with_one_line(tmp_path: Path) -> None:
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"nope")
    cases = [
        ("-m", str(tmp_path / "missing.gguf")),
        ("-m", str(not_gguf)),
        ("--port", "eighty"),
        ("--bogus-flag",),
        ("-m", str(not_gguf), "--ssl-keyfile", str(not_gguf)),
    ]
    for args in cases:
        r = _serve(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("outpost: error:"), (args, r.stderr)


def test_sigterm_drains_in_flight_requests_then_exits_0(tiny_model: Path) -> None:
    server = Server(tiny_model, "-np", "2", "-c", "2048", "--grace-period", "30")
    try:
        _check_drain(server)
    finally:
        server.stop()


def _check_drain(server: Server) -> None:
    # /health is 503 "loading" until the model is in, then 200 "ok".
    server.wait_ready()
    result: dict[str, object] = {}
    first_token = threading.Event()

    def stream() -> None:
        body = {
            "messages": [{"role": "user", "content": "a long story"}],
            "max_tokens": 1500,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if '"content":"' in line and '"content":""' not in line:
                    first_token.set()
            result["events"] = sse_events(lines)

    worker = threading.Thread(target=stream)
    worker.start()
    assert first_token.wait(30)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert server.proc.poll() is None, "must keep serving the in-flight stream"
    health = httpx.get(f"{server.url}/health", timeout=5)
    assert health.status_code == 503 and health.json()["status"] == "draining"
    refused = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert_openai_error(refused, 503, "draining")
    assert httpx.get(f"{server.url}/ping", timeout=5).status_code == 503
    worker.join(60)
    assert not worker.is_alive()
    events = result["events"]
    assert isinstance(events, list) and events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 1500, "the in-flight stream finished in full"
    assert server.proc.wait(30) == 0
    assert "draining" in server.stderr()
