"""Admission and cancellation on a real server: one slot, a queue of two, slow chunked prefill."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import Server, assert_openai_error, start

# One slot, a queue of 2, and 8-token prefill chunks so a long prompt takes seconds to read.
ARGS = ("-np", "1", "--max-queue", "2", "-c", "4096", "-b", "8", "-ub", "8")


def long_prompt(salt: str) -> str:
    """~3000 tokens that share no prefix with another salt's (so the prefix cache cannot help)."""
    return salt + " " + " ".join(f"word{i % 97} apple" for i in range(600))


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, *ARGS) as srv:
        yield srv


def _chat(content: str, max_tokens: int, stream: bool = False) -> dict[str, object]:
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }


def test_overload_gets_429_with_retry_after_and_no_5xx(server: Server) -> None:
    async def one(c: httpx.AsyncClient, i: int) -> httpx.Response:
        return await c.post("/v1/chat/completions", json=_chat(f"request {i}", 48))

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            return await asyncio.wait_for(asyncio.gather(*(one(c, i) for i in range(12))), 120)

    responses = asyncio.run(main())
    statuses = sorted(r.status_code for r in responses)
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) >= 1 and statuses.count(200) >= 3, statuses
    for r in responses:
        if r.status_code == 429:
            assert r.headers["retry-after"].isdigit()
            assert_openai_error(r, 429)
        else:
            assert r.json()["usage"]["completion_tokens"] == 48
    server.wait_idle(5.0)


def _assert_tokens_stop_counting(server: Server) -> None:
    before = server.metric("outpost_generation_tokens_total")
    time.sleep(0.5)
    assert server.metric("outpost_generation_tokens_total") == before


def test_cancel_mid_stream_frees_the_slot(server: Server) -> None:
    with (
        server.client() as c,
        c.stream("POST", "/v1/chat/completions", json=_chat("tell me", 3000, True)) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        content_chunks = 0
        for line in lines:  # bounded: the request asks for 3000 tokens and we leave after 5 chunks
            if '"content":"' in line and '"content":""' not in line:
                content_chunks += 1
            if content_chunks >= 5:
                break
        assert server.health()["slots_busy"] == 1
        tokens_then = server.metric("outpost_generation_tokens_total")
    hung_up = time.monotonic()
    server.wait_idle(3.0)
    assert time.monotonic() - hung_up < 1.0
    _assert_tokens_stop_counting(server)
    assert server.metric("outpost_generation_tokens_total") - tokens_then < 3000 - 5


def test_cancel_mid_prefill_streaming_frees_the_slot(server: Server) -> None:
    body = _chat(long_prompt("streamed"), 8, True)
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # keep the iterator: dropping it closes the connection
        first = next(lines)  # the role chunk is sent at once, before prefill ends
        assert '"role":"assistant"' in first
        time.sleep(0.5)
        assert server.health()["slots_busy"] == 1, "prefill should still be running"
    hung_up = time.monotonic()
    server.wait_idle(3.0)
    assert time.monotonic() - hung_up < 1.0
    _assert_tokens_stop_counting(server)


def test_cancel_mid_prefill_non_streaming_frees_the_slot(server: Server) -> None:
    def hang_up_early() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            httpx.post(
                f"{server.url}/v1/chat/completions", json=_chat(long_prompt("blocking"), 8), timeout=1.0
            )

    caller = threading.Thread(target=hang_up_early)
    started = time.monotonic()
    caller.start()
    time.sleep(0.6)
    assert server.health()["slots_busy"] == 1, "prefill should still be running"
    caller.join(10)
    hung_up = time.monotonic()
    assert hung_up - started < 5.0
    server.wait_idle(3.0)
    assert time.monotonic() - hung_up < 1.0
    _assert_tokens_stop_counting(server)


def test_long_prefill_completes_when_not_cancelled(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", json=_chat(long_prompt("complete"), 4), timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4 and body["usage"]["prompt_tokens"] > 2000
