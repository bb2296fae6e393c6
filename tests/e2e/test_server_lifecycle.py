"""`outpost serve` as a process: bad flags exit 2, SIGTERM drains in-flight work and exits 0,
llama.cpp's buffers on huge pages."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
from server_harness import OUTPOST, Server, anon_huge_pages_kb, assert_openai_error, paced, sse_events

from outpost.engine.hugepages import OPT_OUT, environ_with_hugepages, glibc_version, thp_mode


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
        ("-m", str(not_gguf), "--follow-up-wait", "-5"),
    ]
    for args in cases:
        r = _serve(*args)
        assert r.returncode == 2, (args, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("outpost: error:"), (args, r.stderr)


def test_sigterm_drains_in_flight_requests_then_exits_0(tiny_model: Path) -> None:
    # Paced at >= 25 ms a step: the 300-token stream lasts >= 7.5 s, so it is still in flight
    # while the drain is checked, however fast the machine.
    server = Server(tiny_model, "-np", "2", "-c", "2048", "--grace-period", "300", env=paced(25))
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
            "max_tokens": 300,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=300) as r:
            lines = []
            for line in r.iter_lines():
                lines.append(line)
                if '"content":"' in line and '"content":""' not in line:
                    first_token.set()
            result["events"] = sse_events(lines)

    worker = threading.Thread(target=stream)
    worker.start()
    assert first_token.wait(120)
    server.proc.send_signal(signal.SIGTERM)
    health = _wait_for_health_status(server, "draining", 20.0)
    assert server.proc.poll() is None, "must keep serving the in-flight stream"
    assert health.status_code == 503
    refused = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert_openai_error(refused, 503, "draining")
    assert httpx.get(f"{server.url}/ping", timeout=5).status_code == 503
    worker.join(300)
    assert not worker.is_alive()
    events = result["events"]
    assert isinstance(events, list) and events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 300, "the in-flight stream finished in full"
    assert server.proc.wait(60) == 0
    assert "draining" in server.stderr()


def _wait_for_health_status(server: Server, status: str, timeout: float) -> httpx.Response:
    """Polls /health until it reports `status` (the signal was handled); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(f"{server.url}/health", timeout=5)
        if r.json().get("status") == status:
            return r
        time.sleep(0.02)
    raise AssertionError(f"/health never said {status!r} within {timeout} s: {r.text}")


@pytest.mark.skipif(
    environ_with_hugepages({}, thp_mode(), glibc_version()) is None,
    reason="only where THP is in madvise mode and glibc has the hugetlb tunable (else nothing to do)",
)
def test_serve_runs_llama_cpp_buffers_on_huge_pages_unless_opted_out(tiny_model: Path) -> None:
    """The server re-executes itself (same pid) with glibc's hugetlb tunable, so the weights and
    the KV cache llama.cpp allocates land on transparent huge pages; OUTPOST_HUGEPAGES=0 keeps 4 KiB."""
    for opted_out in (False, True):
        env = {"GLIBC_TUNABLES": "", **({OPT_OUT: "0"} if opted_out else {})}
        server = Server(tiny_model, "-c", "4096", env=env)
        try:
            server.wait_ready()
            environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes().split(b"\0")
            assert (b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in environ) is not opted_out
            huge_kb = anon_huge_pages_kb(server.proc.pid)
            assert (huge_kb == 0) if opted_out else (huge_kb >= 2048), huge_kb
            r = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        finally:
            server.stop()
