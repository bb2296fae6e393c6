"""One measured pass of one arm at one stream count: requests streamed over HTTP, timed at the client.

Decode tok/s counts the tokens after each request's first and the time from its first token to its
last; with several streams it is the aggregate: the sum of every stream's own rate. Tokens are the
server's own count (`usage`); drafted and accepted counts its `timings` (llama-server's `draft_n`,
`draft_n_accepted`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.spec.tasks import Task


@dataclass
class Reply:
    task: str
    text: str = ""
    tokens: int = 0
    sent_s: float | None = None  # when the request went out
    first_s: float | None = None
    last_s: float | None = None
    draft_n: int = 0
    draft_n_accepted: int = 0
    error: str | None = None


@dataclass
class PassResult:
    streams: int
    replies: list[Reply] = field(default_factory=list)

    @property
    def errors(self) -> int:
        return sum(r.error is not None for r in self.replies)

    def ttft_s(self) -> float | None:
        """The median time to first token over this pass's replies."""
        waits = [r.first_s - r.sent_s for r in self.replies if r.first_s is not None and r.sent_s is not None]
        return statistics.median(waits) if waits else None

    def e2e_tok_s(self) -> float | None:
        """1 stream: tokens over each request's whole time (prompt read, first token, decode): what
        moving work between the prompt's time and the decode's time cannot flatter."""
        ok = [r for r in self.replies if r.error is None and r.last_s is not None and r.sent_s is not None]
        span = sum((r.last_s or 0.0) - (r.sent_s or 0.0) for r in ok)
        return sum(r.tokens for r in ok) / span if ok and span > 0 else None

    def pass_tok_s(self) -> float | None:
        """N streams: every reply's tokens over the pass's wall time (first request sent to last
        token), which no server can raise by reading prompts before it decodes."""
        ok = [r for r in self.replies if r.error is None and r.last_s is not None and r.sent_s is not None]
        if not ok:
            return None
        span = max(r.last_s or 0.0 for r in ok) - min(r.sent_s or 0.0 for r in ok)
        return sum(r.tokens for r in ok) / span if span > 0 else None

    def decode_tok_s(self, tasks: set[str] | None = None) -> float | None:
        ok = [r for r in self.replies if r.error is None and r.first_s is not None and r.tokens > 1]
        if tasks is not None:
            ok = [r for r in ok if r.task in tasks]
        if not ok:
            return None
        rates = [
            (r.tokens - 1) / ((r.last_s or 0.0) - (r.first_s or 0.0)) for r in ok if r.last_s != r.first_s
        ]
        if not rates:
            return None
        if self.streams == 1:  # one after another: tokens over each request's own decode time
            span = sum((r.last_s or 0.0) - (r.first_s or 0.0) for r in ok)
            return sum(r.tokens - 1 for r in ok) / span
        # Together: the sum of each stream's own rate (their prompts arrive at once and are read
        # beside the others' decoding, so a span from the first first token would time prefill).
        return sum(rates) * self.streams / len(rates) if tasks is None else sum(rates)


async def _one(client: httpx.AsyncClient, url: str, task: Task, max_tokens: int) -> Reply:
    reply = Reply(task.name, sent_s=time.perf_counter())
    body = {
        "messages": task.messages(),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "seed": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_prompt": False,
    }
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                reply.error = f"HTTP {resp.status_code}"
                return reply
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                _read(reply, json.loads(line[6:]), time.perf_counter())
    except httpx.HTTPError as exc:
        reply.error = f"{type(exc).__name__}: {exc}"
    return reply


def _read(reply: Reply, event: dict, now: float) -> None:  # type: ignore[type-arg]
    if "error" in event:
        reply.error = str(event["error"])[:200]
    usage = event.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        reply.tokens = int(usage["completion_tokens"])
    timings = event.get("timings")
    if isinstance(timings, dict):
        reply.draft_n = int(timings.get("draft_n") or 0)
        reply.draft_n_accepted = int(timings.get("draft_n_accepted") or 0)
    for choice in event.get("choices") or []:
        text = (choice.get("delta") or {}).get("content")
        if text:
            reply.text += text
            reply.first_s = now if reply.first_s is None else reply.first_s
            reply.last_s = now


async def run_pass(url: str, tasks: list[Task], streams: int, max_tokens: int) -> PassResult:
    """1 stream: the tasks one after another; N streams: N requests at once, the tasks in turn."""
    result = PassResult(streams)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0)) as client:
        if streams == 1:
            for task in tasks:
                result.replies.append(await _one(client, url, task, max_tokens))
        else:
            batch = [tasks[i % len(tasks)] for i in range(streams)]
            result.replies = list(await asyncio.gather(*(_one(client, url, t, max_tokens) for t in batch)))
    return result
