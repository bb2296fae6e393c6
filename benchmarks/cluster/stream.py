"""A streaming chat client that checks every stream, for benchmarks/cluster/'s (d) and (f).

Each token arrives with its own `logprobs` entry (the request asks `logprobs: true`), so the client
numbers tokens 0, 1, 2, ... as they arrive: that count is what the stream delivered, whatever
the chunking. A stream is checked for:

- a final outcome: exactly one chunk with a `finish_reason` (or an HTTP error status, or an error
  event) and exactly one `data: [DONE]`; a stream that ends (or times out) without one has none;
- complete tokens: with every end-of-generation token banned and `finish_reason` "length", the
  tokens received must be exactly `max_tokens` (more: duplicated, fewer: missing) and equal the
  gateway's own count (`usage.completion_tokens`, counted from the token ids it forwarded);
- text consistent with the tokens: the content deltas joined equal the tokens' `bytes` joined and
  decoded (a resume that repeated or dropped held-back text would break it).

`timings` of the final chunk are the last run's: a resumed stream's `prompt_n + cache_n` exceeds
`usage.prompt_tokens` by the tokens it resumed after (no preemption: the KV holds every slot).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

FINAL_OK = ("length", "stop")


@dataclass
class StreamRecord:
    index: int
    prompt: int  # which prompt of the pool it sent
    start_s: float  # since the run's start
    max_tokens: int
    end_s: float | None = None
    status: int | None = None
    chunk_s: list[float] = field(default_factory=list)  # arrival of each chunk with tokens, since start
    chunk_n: list[int] = field(default_factory=list)  # its tokens (logprobs entries; 1 without them)
    tokens: int = 0  # logprobs entries received: tokens numbered by arrival
    chunks: int = 0  # content chunks
    text: str = ""
    raw: bytearray = field(default_factory=bytearray)
    finish_chunks: int = 0
    finish_reason: str | None = None
    done: int = 0
    usage_tokens: int | None = None
    usage_prompt: int | None = None
    prompt_n: int | None = None
    cache_n: int | None = None
    error: str | None = None  # HTTP status, "stream_error" or an exception class
    error_detail: str = ""

    @property
    def outcome(self) -> str:
        """ok | error (a final error: status, error event, other finish) | none (no final outcome)."""
        if self.status is not None and self.status != 200:
            return "error"
        if self.error == "stream_error":
            return "error"
        if self.finish_chunks == 0:
            return "none"
        return "ok" if self.finish_reason in FINAL_OK else "error"

    @property
    def expected_tokens(self) -> int | None:
        if self.finish_reason == "length":
            return self.max_tokens
        return self.usage_tokens

    @property
    def duplicated(self) -> int:
        exp = self.expected_tokens
        return max(0, self.tokens - exp) if self.outcome == "ok" and exp is not None else 0

    @property
    def missing(self) -> int:
        exp = self.expected_tokens
        return max(0, exp - self.tokens) if self.outcome == "ok" and exp is not None else 0

    def faults(self, logprobs: bool = True) -> list[str]:
        """What is wrong with a stream that has a final outcome (empty: nothing)."""
        if self.outcome == "none":
            return []
        out = []
        if self.finish_chunks > 1:
            out.append("finish_chunks")
        if self.done != 1:
            out.append("done")
        if self.outcome == "ok" and logprobs:
            if self.duplicated:
                out.append("duplicated")
            if self.missing:
                out.append("missing")
            if self.usage_tokens != self.tokens:
                out.append("usage")
            if bytes(self.raw).decode("utf-8", "replace") != self.text:
                out.append("text")
        return out

    @property
    def resumed_after(self) -> int:
        """Tokens the last run resumed after (0: not resumed mid-stream, or unknown)."""
        if self.prompt_n is None or self.cache_n is None or self.usage_prompt is None:
            return 0
        return max(0, self.prompt_n + self.cache_n - self.usage_prompt)

    @property
    def max_gap_s(self) -> float | None:
        """The longest wait between two chunks with tokens."""
        gaps = [b - a for a, b in zip(self.chunk_s, self.chunk_s[1:], strict=False)]
        return max(gaps) if gaps else None

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_s[0] if self.chunk_s else None


def chat_body(
    model: str, text: str, max_tokens: int, extra: dict[str, Any], logprobs: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    if logprobs:
        body["logprobs"] = True
    return body


async def stream(
    client: httpx.AsyncClient, body: dict[str, Any], record: StreamRecord, timeout: float
) -> None:
    """POST `body` and fill `record`; never raises (an exception is the record's error)."""
    t0 = time.perf_counter()
    try:
        await asyncio.wait_for(_read(client, body, record, t0), timeout)
    except Exception as exc:  # counted, never a crash
        record.error = record.error or type(exc).__name__
        record.error_detail = str(exc)[:200]
    record.end_s = record.start_s + (time.perf_counter() - t0)


async def _read(client: httpx.AsyncClient, body: dict[str, Any], record: StreamRecord, t0: float) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
        record.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            record.error, record.error_detail = str(r.status_code), r.text[:200]
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                record.done += 1  # read on: anything after it would be a fault
                continue
            on_event(json.loads(payload), record, time.perf_counter() - t0)


def on_event(event: Any, record: StreamRecord, now: float) -> None:
    if not isinstance(event, dict):
        return
    if "error" in event:
        record.error, record.error_detail = "stream_error", json.dumps(event["error"])[:200]
        return
    usage = event.get("usage")
    if isinstance(usage, dict):
        record.usage_tokens = usage.get("completion_tokens")
        record.usage_prompt = usage.get("prompt_tokens")
    timings = event.get("timings")
    if isinstance(timings, dict):
        record.prompt_n, record.cache_n = timings.get("prompt_n"), timings.get("cache_n")
    for choice in event.get("choices") or []:
        text = (choice.get("delta") or {}).get("content") or ""
        entries = ((choice.get("logprobs") or {}).get("content")) or []
        record.text += text
        record.tokens += len(entries)
        for entry in entries:
            record.raw += bytes(entry.get("bytes") or [])
        if text:
            record.chunks += 1
        if text or entries:
            record.chunk_s.append(now)
            record.chunk_n.append(len(entries) or 1)
        if choice.get("finish_reason"):
            record.finish_chunks += 1
            record.finish_reason = choice["finish_reason"]
