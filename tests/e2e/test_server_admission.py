"""Admission and cancellation on a real server: one slot, a queue of two, slow chunked prefill.

The server is paced (every decoding step takes >= STEP_MS, see `server_harness.paced`): a long
prompt's prefill then lasts >= 375 steps * 20 ms = 7.5 s on any machine, so the tests cancel it
while it is provably still running, and prove the cancel by counters, not by the clock."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_harness import Server, assert_openai_error, paced, start

# One slot, a queue of 2, and 8-token prefill chunks so a long prompt takes seconds to read.
ARGS = ("-np", "1", "--max-queue", "2", "-c", "4096", "-b", "8", "-ub", "8", "--sse-keepalive", "0.2")
STEP_MS = 20
# Far below what the held work lasts (>= 7.5 s of prefill, >= 60 s for 3,000 tokens): a slot that
# frees within it was freed by the cancel.
FREED_WITHIN_S = 5.0


def long_prompt(salt: str) -> str:
    """~3000 tokens that share no prefix with another salt's (so the prefix cache cannot help)."""
    return salt + " " + " ".join(f"word{i % 97} apple" for i in range(600))


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, *ARGS, env=paced(STEP_MS)) as srv:
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
    server.wait_idle(30.0)


def _wait_busy(server: Server, timeout: float = 30.0) -> None:
    """Polls /health until the slot is taken (the request was admitted); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while server.health()["slots_busy"] != 1:
        assert time.monotonic() < deadline, f"the request never took the slot: {server.health()}"
        time.sleep(0.02)


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
    server.wait_idle(FREED_WITHIN_S)  # the rest of the 3,000 tokens would take >= 60 s
    _assert_tokens_stop_counting(server)
    assert server.metric("outpost_generation_tokens_total") - tokens_then < 3000 - 5


def test_cancel_mid_prefill_streaming_frees_the_slot(server: Server) -> None:
    generated = server.metric("outpost_generation_tokens_total")
    body = _chat(long_prompt("streamed"), 8, True)
    with server.client() as c, c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # keep the iterator: dropping it closes the connection
        first = next(lines)  # the role chunk is sent at once, before prefill ends
        assert '"role":"assistant"' in first
        _wait_busy(server)
    server.wait_idle(FREED_WITHIN_S)
    _assert_tokens_stop_counting(server)
    # Not one token came: the request ended inside its prefill, not after it.
    assert server.metric("outpost_generation_tokens_total") == generated


def test_cancel_mid_prefill_non_streaming_frees_the_slot(server: Server) -> None:
    generated = server.metric("outpost_generation_tokens_total")

    async def hang_up_mid_prefill() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
            call = asyncio.ensure_future(
                c.post("/v1/chat/completions", json=_chat(long_prompt("blocking"), 8))
            )
            await asyncio.to_thread(_wait_busy, server)
            assert not call.done(), "the prefill cannot have ended: it takes >= 7.5 s"
            call.cancel()  # the client goes away: its connection closes
            with contextlib.suppress(asyncio.CancelledError):
                await call

    asyncio.run(hang_up_mid_prefill())
    server.wait_idle(FREED_WITHIN_S)
    _assert_tokens_stop_counting(server)
    assert server.metric("outpost_generation_tokens_total") == generated


def test_a_queued_stream_gets_keepalive_comments_until_its_first_token(server: Server) -> None:
    """SSE comments keep a waiting stream open through proxies; the slot is held by a paced
    3,000-token stream (>= 60 s), so the queued one provably waits while we read them."""
    with (
        server.client() as c,
        c.stream("POST", "/v1/chat/completions", json=_chat("blocker", 3000, True)) as blocker,
    ):
        blocker_lines = blocker.iter_lines()  # kept: dropping it would hang up
        assert '"role":"assistant"' in next(blocker_lines)
        _wait_busy(server)
        with c.stream("POST", "/v1/chat/completions", json=_chat("queued", 4, True)) as queued:
            lines = queued.iter_lines()
            assert '"role":"assistant"' in next(lines)
            comments = 0
            for line in lines:  # bounded: 3 comments come within ~0.6 s, the blocker holds >= 60 s
                assert '"content":"' not in line or '"content":""' in line, "a token while queued"
                if line == ": keep-alive":
                    comments += 1
                    if comments == 3:
                        break
            assert server.health()["queue_depth"] == 1
    server.wait_idle(FREED_WITHIN_S)


def test_openai_client_streams_through_keepalive_comments(server: Server) -> None:
    """~500 prompt tokens take >= 63 paced steps (1.3 s): comments arrive before the first token."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = " ".join(f"word{i % 97} apple" for i in range(100))
    stream = client.chat.completions.create(
        model="tiny-f16",
        messages=[{"role": "user", "content": prompt}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert "keep-alive" not in text


def test_long_prefill_completes_when_not_cancelled(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/chat/completions", json=_chat(long_prompt("complete"), 4), timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 4 and body["usage"]["prompt_tokens"] > 2000
