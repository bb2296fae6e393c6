"""The soak's request kinds (benchmarks/soak/): each sends one request of its kind and says what
came back, as one of the outcomes below. Part of the soak benchmark, not run on its own.

Outcomes: `ok` (a complete answer), `rejected_429` (queue full: expected under overload),
`expected_4xx` (a bad or over-long request answered with an OpenAI error), `cancelled` (we closed
the connection on purpose), `5xx`, `stream_error` (an `{"error"}` event after a 200), `unexpected`
(an answer of the wrong kind: a 400 to a valid request, a 200 to a bad one, a short output), and the
`lost_*` ones: neither a complete answer nor a defined error (a stream cut without its final chunk
or [DONE], a hang past the client timeout, a reset connection we did not close, a garbled body).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from outpost.bench.client import PATHS, request_body, send
from outpost.bench.config import Endpoint
from outpost.bench.prompts import PromptBuilder
from outpost.bench.records import INCOMPLETE, SHORT_OUTPUT, STREAM_ERROR, Accepted, RequestRecord
from outpost.bench.tokens import ServerTokenizer

OK, REJECTED, EXPECTED_4XX, CANCELLED = "ok", "rejected_429", "expected_4xx", "cancelled"
SERVER_5XX, STREAM_ERR, UNEXPECTED = "5xx", "stream_error", "unexpected"
LOST_INCOMPLETE, LOST_TIMEOUT, LOST_RESET, LOST_BAD_BODY = (
    "lost_incomplete",
    "lost_timeout",
    "lost_reset",
    "lost_bad_body",
)
LOST = (LOST_INCOMPLETE, LOST_TIMEOUT, LOST_RESET, LOST_BAD_BODY)
OUTCOMES = (OK, REJECTED, EXPECTED_4XX, CANCELLED, SERVER_5XX, STREAM_ERR, UNEXPECTED, *LOST)
_TIMEOUT_NAMES = {"TimeoutError", "ReadTimeout", "WriteTimeout", "ConnectTimeout", "PoolTimeout"}


@dataclass(frozen=True)
class Out:
    outcome: str
    status: int | None = None
    ttft_s: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Result:
    """One request of the soak; times in seconds since the load started."""

    kind: str
    start_s: float
    elapsed_s: float
    outcome: str
    status: int | None
    ttft_s: float | None
    detail: str


class PromptCounter(ServerTokenizer):
    """Counts as /v1/completions tokenizes a prompt: special tokens (BOS) included."""

    def _body(self, text: str) -> dict[str, Any]:
        return {"content": text, "add_special": True}


@dataclass
class StatusTally:
    """An httpx response hook: every status the server answered, on any path, and the 429s that
    came without Retry-After."""

    by_status: Counter[int] = field(default_factory=Counter)
    no_retry_after: int = 0
    server_errors: list[str] = field(default_factory=list)

    async def __call__(self, response: httpx.Response) -> None:
        status = response.status_code
        self.by_status[status] += 1
        if status == 429 and "retry-after" not in response.headers:
            self.no_retry_after += 1
        if status >= 500 and len(self.server_errors) < 50:
            self.server_errors.append(f"{response.request.method} {response.request.url.path} {status}")


@dataclass
class Ctx:
    """What every kind needs. `exact` fits prompts to exact token counts (None: the server has no
    /tokenize, and the context-limit kinds are off); `limit` is the per-request context."""

    client: httpx.AsyncClient
    model: str
    accepted: Accepted
    fill: list[str]
    exact: PromptBuilder | None
    limit: int | None
    slots: int
    max_queue: int
    burst_extra: int
    timeout: float
    long_prompt: int  # tokens of the mid-prefill cancel's prompt
    priming: bool = False  # every size at its largest: the first pass touches every buffer

    def size(self, rng: random.Random, low: int, high: int) -> int:
        """A request's size in [low, high] (`high` while priming; `low` may be above `high`)."""
        return high if self.priming else rng.randint(min(low, high), max(low, high))

    def words(self, rng: random.Random, n: int) -> str:
        """About `n` tokens of distinct text (each fill word is one token after another word)."""
        return " ".join(rng.choice(self.fill) for _ in range(max(1, n)))

    def body(
        self, endpoint: Endpoint, rng: random.Random, n_in: int, n_out: int, stream: bool
    ) -> dict[str, Any]:
        body = request_body(endpoint, self.model, None, self.words(rng, n_in), n_out, self.accepted)
        if not stream:
            body["stream"] = False
            body.pop("stream_options", None)
        return body


Kind = Callable[[Ctx, random.Random], Awaitable[Out]]


def success_status(status: int, detail: str = "") -> Out:
    """A request that should have been served got `status` instead."""
    if status == 429:
        return Out(REJECTED, status)
    if status >= 500:
        return Out(SERVER_5XX, status, detail=detail[:300])
    return Out(UNEXPECTED, status, detail=detail[:300])


def from_record(record: RequestRecord) -> Out:
    """outpost.bench's record of one stream as an outcome."""
    err, status, detail = record.error, record.status, record.error_detail
    if err is None:
        return Out(OK, status, record.ttft_s)
    if err.isdigit():
        return success_status(int(err), detail)
    named = {STREAM_ERROR: STREAM_ERR, INCOMPLETE: LOST_INCOMPLETE, SHORT_OUTPUT: UNEXPECTED}
    if err in named:
        return Out(named[err], status, record.ttft_s, detail)
    if err in _TIMEOUT_NAMES:
        return Out(LOST_TIMEOUT, status, detail=err)
    if err == "JSONDecodeError":
        return Out(LOST_BAD_BODY, status, detail=detail)
    return Out(LOST_RESET, status, detail=f"{err}: {detail}")


async def stream_chat(ctx: Ctx, rng: random.Random) -> Out:
    n_out = ctx.size(rng, 16, 128)
    body = ctx.body("chat", rng, ctx.size(rng, 20, 200), n_out, stream=True)
    record = RequestRecord(0, 0.0, 0, n_out)
    return from_record(await send(ctx.client, PATHS["chat"], body, record, ctx.timeout))


def check_answer(reply: Any, endpoint: str, n_out: int, accepted: Accepted) -> Out:
    """A non-streamed 200: one choice with text, a finish reason, usage; max_tokens tokens where
    the server accepted ignore_eos. A body without those is garbled (lost)."""
    try:
        choice = reply["choices"][0]
        text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
        reason, used = choice["finish_reason"], int(reply["usage"]["completion_tokens"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        return Out(LOST_BAD_BODY, 200, detail=f"{type(exc).__name__}: {json.dumps(reply)[:200]}")
    if not isinstance(text, str) or reason not in ("stop", "length"):
        return Out(LOST_BAD_BODY, 200, detail=f"text={type(text).__name__} finish_reason={reason}")
    if accepted.ignore_eos and (used != n_out or reason != "length"):
        return Out(UNEXPECTED, 200, detail=f"{used} of {n_out} tokens, finish_reason={reason}")
    return Out(OK, 200)


async def plain(ctx: Ctx, rng: random.Random, endpoint: Endpoint) -> Out:
    n_out = ctx.size(rng, 8, 96)
    body = ctx.body(endpoint, rng, ctx.size(rng, 20, 200), n_out, stream=False)
    r = await ctx.client.post(PATHS[endpoint], json=body)
    if r.status_code != 200:
        return success_status(r.status_code, r.text)
    return check_answer(r.json(), endpoint, n_out, ctx.accepted)


async def chat(ctx: Ctx, rng: random.Random) -> Out:
    return await plain(ctx, rng, "chat")


async def completion(ctx: Ctx, rng: random.Random) -> Out:
    return await plain(ctx, rng, "completions")


def sse_event(line: str) -> tuple[str, Any]:
    """('done'|'event'|'other', payload) for one SSE line; a garbled event raises ValueError."""
    if not line.startswith("data:"):
        return "other", None
    payload = line[5:].strip()
    return ("done", None) if payload == "[DONE]" else ("event", json.loads(payload))


def has_token(event: Any) -> bool:
    choices = event.get("choices") if isinstance(event, dict) else None
    return any((c.get("delta") or {}).get("content") or c.get("text") for c in choices or [])


async def read_until(r: httpx.Response, tokens: int) -> Out | None:
    """Read a 200 stream until `tokens` content chunks arrived (None: cut it there), or it ended."""
    seen = 0
    async for line in r.aiter_lines():
        what, event = sse_event(line)
        if what == "done":
            return Out(OK, 200, detail=f"finished before the cut ({seen} tokens)")
        if what == "event" and isinstance(event, dict) and "error" in event:
            return Out(STREAM_ERR, 200, detail=json.dumps(event["error"])[:200])
        if what == "event" and has_token(event):
            seen += 1
        if seen >= tokens:
            return None
    return Out(LOST_INCOMPLETE, 200, detail=f"stream ended without [DONE] after {seen} tokens")


async def cancel_decode(ctx: Ctx, rng: random.Random) -> Out:
    """A stream closed by the client after N tokens (the server must free the slot)."""
    n = rng.randint(1, 24)
    body = ctx.body("chat", rng, ctx.size(rng, 20, 120), 256, stream=True)
    async with ctx.client.stream("POST", PATHS["chat"], json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return success_status(r.status_code, r.text)
        out = await read_until(r, n)
    return out or Out(CANCELLED, 200, detail="mid-decode")


async def cancel_prefill(ctx: Ctx, rng: random.Random) -> Out:
    """A long prompt whose stream is closed 0.1-1 s after the headers, before its first token
    (detail `late` when a token came first: the prefill was faster than the cut)."""
    body = ctx.body("chat", rng, ctx.long_prompt, 64, stream=True)
    delay = rng.uniform(0.1, 1.0)
    async with ctx.client.stream("POST", PATHS["chat"], json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return success_status(r.status_code, r.text)
        try:
            async with asyncio.timeout(delay):
                out = await read_until(r, 1)
        except TimeoutError:
            return Out(CANCELLED, 200, detail="mid-prefill")
    return out or Out(CANCELLED, 200, detail="late")


async def near_limit(ctx: Ctx, rng: random.Random) -> Out:
    """Prompt + max_tokens exactly the per-request context (1-4 tokens of output): must be served."""
    assert ctx.exact is not None and ctx.limit is not None
    fitted = await ctx.exact.fit(rng, ctx.limit - ctx.size(rng, 4, 1))
    room = ctx.limit - fitted.tokens
    body: dict[str, Any] = {"model": ctx.model, "prompt": fitted.text, "max_tokens": room}
    if ctx.accepted.ignore_eos:
        body["ignore_eos"] = True
    r = await ctx.client.post(PATHS["completions"], json=body)
    if r.status_code != 200:
        return success_status(r.status_code, f"{fitted.tokens}+{room} tokens: {r.text}")
    out = check_answer(r.json(), "completions", room, ctx.accepted)
    used = r.json().get("usage", {}).get("prompt_tokens")
    if out.outcome == OK and used != fitted.tokens:
        return Out(UNEXPECTED, 200, detail=f"prompt_tokens {used}, /tokenize counted {fitted.tokens}")
    return out


async def over_limit(ctx: Ctx, rng: random.Random) -> Out:
    """One token over the per-request context (prompt + max_tokens, or the prompt alone filling
    it): must be a 400 context_length_exceeded, before any prefill."""
    assert ctx.exact is not None and ctx.limit is not None
    body: dict[str, Any] = {"model": ctx.model}
    if rng.random() < 0.5:
        fitted = await ctx.exact.fit(rng, ctx.limit - rng.randint(1, 4))
        body["max_tokens"] = ctx.limit - fitted.tokens + 1
    else:
        fitted = await ctx.exact.fit(rng, ctx.limit)
    body["prompt"] = fitted.text
    r = await ctx.client.post(PATHS["completions"], json=body)
    what = f"limit {ctx.limit}: {fitted.tokens} prompt tokens, max_tokens {body.get('max_tokens')}"
    return expect_4xx(r, code="context_length_exceeded", what=what)


def expect_4xx(r: httpx.Response, code: str | None = None, what: str = "") -> Out:
    """A bad request: any 4xx (429 aside) with an OpenAI error body, `code` when given."""
    status = r.status_code
    if status == 429:
        return Out(REJECTED, status)
    if status >= 500:
        return Out(SERVER_5XX, status, detail=f"{what}: {r.text[:200]}")
    if not 400 <= status < 500:
        return Out(UNEXPECTED, status, detail=f"{what}: a bad request answered {status}")
    try:
        error = r.json()["error"]
        message = error["message"]
    except (ValueError, KeyError, TypeError):
        return Out(UNEXPECTED, status, detail=f"{what}: no OpenAI error body: {r.text[:200]}")
    if code is not None and error.get("code") != code:
        return Out(UNEXPECTED, status, detail=f"{what}: code {error.get('code')!r}, not {code}: {message}")
    return Out(EXPECTED_4XX, status)


def _bad_bodies(model: str) -> list[tuple[str, str, Any]]:
    """(name, path, body: bytes sent as is, or JSON): every one must be a 4xx."""
    msgs = [{"role": "user", "content": "hello there"}]
    chat, comp = PATHS["chat"], PATHS["completions"]
    return [
        ("malformed_json", chat, b'{"messages": [{"role": "user", "content": "hi"}'),
        ("empty_body", chat, b""),
        ("not_an_object", chat, b"[1, 2, 3]"),
        ("messages_string", chat, {"model": model, "messages": "hello"}),
        ("max_tokens_string", chat, {"model": model, "messages": msgs, "max_tokens": "ten"}),
        ("temperature_list", chat, {"model": model, "messages": msgs, "temperature": [1]}),
        ("bad_role", chat, {"model": model, "messages": [{"role": "robot", "content": "hi"}]}),
        ("unknown_model", chat, {"model": "no-such-model", "messages": msgs}),
        ("unknown_model_stream", chat, {"model": "no-such-model", "messages": msgs, "stream": True}),
        ("n_2", chat, {"model": model, "messages": msgs, "n": 2}),
        ("negative_max_tokens", comp, {"model": model, "prompt": "hi", "max_tokens": -5}),
        ("token_out_of_range", comp, {"model": model, "prompt": [10**9]}),
        ("embeddings_int", "/v1/embeddings", {"model": model, "input": 5}),
    ]


async def bad_request(ctx: Ctx, rng: random.Random) -> Out:
    name, path, body = rng.choice(_bad_bodies(ctx.model))
    headers = {"Content-Type": "application/json"}
    if isinstance(body, bytes):
        r = await ctx.client.post(path, content=body, headers=headers)
    else:
        r = await ctx.client.post(path, json=body)
    return expect_4xx(r, what=name)


async def embeddings(ctx: Ctx, rng: random.Random) -> Out:
    texts = [ctx.words(rng, ctx.size(rng, 3, 40)) for _ in range(ctx.size(rng, 1, 4))]
    body = {"model": ctx.model, "input": texts if len(texts) > 1 else texts[0]}
    r = await ctx.client.post("/v1/embeddings", json=body)
    if r.status_code != 200:
        return success_status(r.status_code, r.text)
    try:
        vectors = [item["embedding"] for item in r.json()["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        return Out(LOST_BAD_BODY, 200, detail=f"{type(exc).__name__}: {r.text[:200]}")
    dims = {len(v) if isinstance(v, list) else 0 for v in vectors}
    if len(vectors) != len(texts) or len(dims) != 1 or 0 in dims:
        return Out(LOST_BAD_BODY, 200, detail=f"{len(vectors)} vectors for {len(texts)} inputs, dims {dims}")
    return Out(OK, 200)


async def burst_one(ctx: Ctx, rng: random.Random) -> Out:
    """One request of an overload burst: served, or 429 (Retry-After is checked by StatusTally)."""
    n_out = ctx.size(rng, 4, 16)
    body = ctx.body("completions", rng, ctx.size(rng, 8, 40), n_out, stream=False)
    r = await ctx.client.post(PATHS["completions"], json=body)
    if r.status_code != 200:
        return success_status(r.status_code, r.text)
    return check_answer(r.json(), "completions", n_out, ctx.accepted)


KINDS: dict[str, Kind] = {
    "stream_chat": stream_chat,
    "chat": chat,
    "completion": completion,
    "cancel_prefill": cancel_prefill,
    "cancel_decode": cancel_decode,
    "near_limit": near_limit,
    "over_limit": over_limit,
    "embeddings": embeddings,
    "bad_request": bad_request,
}
NEEDS_LIMIT = ("near_limit", "over_limit")


async def run_one(kind: str, fn: Kind, ctx: Ctx, rng: random.Random, t0: float) -> Result:
    """One request, bounded by the client timeout; what it raises becomes a lost outcome."""
    start = time.perf_counter()
    try:
        out = await asyncio.wait_for(fn(ctx, rng), ctx.timeout)
    except (TimeoutError, httpx.TimeoutException) as exc:
        out = Out(LOST_TIMEOUT, detail=f"{type(exc).__name__} after {ctx.timeout:g} s")
    except httpx.TransportError as exc:
        out = Out(LOST_RESET, detail=f"{type(exc).__name__}: {exc}"[:300])
    except ValueError as exc:  # a body that is not the JSON it should be
        out = Out(LOST_BAD_BODY, detail=f"{type(exc).__name__}: {exc}"[:300])
    end = time.perf_counter()
    return Result(kind, start - t0, end - start, out.outcome, out.status, out.ttft_s, out.detail)


async def run_burst(ctx: Ctx, rng: random.Random, t0: float) -> list[Result]:
    """slots + max_queue + extra short requests at once: more than the server may hold, so some
    must be 429s with Retry-After; none may be a 5xx."""
    n = ctx.slots + ctx.max_queue + ctx.burst_extra
    seeds = [rng.random() for _ in range(n)]
    return list(
        await asyncio.gather(*(run_one("burst", burst_one, ctx, random.Random(s), t0) for s in seeds))
    )
