"""HTTP against an OpenAI-compatible server: list models, probe which extension fields it accepts,
and send one streamed request, timing every content chunk.

Every failure becomes a `RequestRecord.error` (status code, exception class, or a stream fault),
never an exception out of `send`: a benchmark counts errors, it does not stop on them.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any, NoReturn

import httpx

from outpost.bench.config import BenchUsageError, Endpoint
from outpost.bench.records import INCOMPLETE, SHORT_OUTPUT, STREAM_ERROR, Accepted, RequestRecord

PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
# Statuses that mean "this body field is not accepted" (OpenAI 400, pydantic-strict servers 422).
REJECTED = (400, 422)


class BenchError(RuntimeError):
    """The benchmark cannot run against this server (unreachable, no model): exit 1."""


def make_client(url: str, api_key: str | None, timeout: float, connections: int | None) -> httpx.AsyncClient:
    """`connections` None: no pool limit (open loop)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(
        base_url=url,
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
    )


async def first_model(client: httpx.AsyncClient) -> str:
    """The first id `/v1/models` lists."""
    try:
        r = await client.get("/v1/models")
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {client.base_url}: {type(exc).__name__}: {exc}") from exc
    if r.status_code != 200:
        raise BenchUsageError(f"{client.base_url}/v1/models answered HTTP {r.status_code}: give --model")
    try:
        return str(r.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BenchUsageError(f"{client.base_url}/v1/models lists no model: give --model") from None


def request_body(
    endpoint: Endpoint, model: str, system: str | None, text: str, max_tokens: int, accepted: Accepted
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": True}
    if endpoint == "chat":
        messages = [{"role": "system", "content": system}] if system else []
        body["messages"] = [*messages, {"role": "user", "content": text}]
    else:
        body["prompt"] = f"{system}\n\n{text}" if system else text
    # Output lengths as asked: the model may not stop early (vLLM, llama-server, Outpost accept these).
    if accepted.ignore_eos:
        body["ignore_eos"] = True
    if accepted.min_tokens:
        body["min_tokens"] = max_tokens
    if accepted.include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


_EXTENSIONS = ("min_tokens", "ignore_eos", "include_usage")


async def probe(client: httpx.AsyncClient, endpoint: Endpoint, model: str, extra: dict[str, Any]) -> Accepted:
    """Try one tiny request with every extension field, dropping them one by one until the server
    accepts it (<= 4 tries), then giving each dropped field back alone (<= 3 more): a server that
    rejects only `stream_options` must still get `ignore_eos` and `min_tokens`."""
    accepted = Accepted(ignore_eos=True, min_tokens=True, include_usage=True)
    for drop in (*_EXTENSIONS, None):
        r = await _try(client, endpoint, model, accepted, extra)
        if r.status_code == 200:
            break
        if r.status_code not in REJECTED or drop is None:
            _probe_failed(client, endpoint, model, r)
        accepted = replace(accepted, **{drop: False})
    for name in _EXTENSIONS:
        trial = replace(accepted, **{name: True})
        if trial != accepted and (await _try(client, endpoint, model, trial, extra)).status_code == 200:
            accepted = trial
    return accepted


async def _try(
    client: httpx.AsyncClient, endpoint: Endpoint, model: str, accepted: Accepted, extra: dict[str, Any]
) -> httpx.Response:
    body = {**request_body(endpoint, model, None, "Hello", 2, accepted), **extra}
    try:
        return await client.post(PATHS[endpoint], json=body)
    except httpx.HTTPError as exc:
        raise BenchError(f"cannot reach {client.base_url}: {type(exc).__name__}: {exc}") from exc


def _probe_failed(client: httpx.AsyncClient, endpoint: Endpoint, model: str, r: httpx.Response) -> NoReturn:
    where = f"{client.base_url}{PATHS[endpoint]} answered HTTP {r.status_code}: {r.text[:200]}"
    # the command line is wrong, not the server: exit 2 saying what to change
    hints = {
        401: "give --api-key",
        403: "check --api-key",
        404: f"is --model {model!r} served, --endpoint right?",
    }
    if r.status_code in hints:
        raise BenchUsageError(f"{where} ({hints[r.status_code]})")
    raise BenchError(where)


async def send(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], record: RequestRecord, timeout: float
) -> RequestRecord:
    """POST `body` as a stream and fill `record`; errors are recorded, never raised."""
    start = time.perf_counter()
    try:
        await asyncio.wait_for(_stream(client, path, body, record, start), timeout)
    except Exception as exc:  # whatever the server does wrong is a counted error, never a crash
        record.error = type(exc).__name__
        record.error_detail = str(exc)[:200]
    record.e2e_s = time.perf_counter() - start
    if record.error is None:
        _check_complete(record, body)
    return record


async def _stream(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], record: RequestRecord, start: float
) -> None:
    async with client.stream("POST", path, json=body) as r:
        record.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            record.error = str(r.status_code)
            record.error_detail = r.text[:200]
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, comments, `event:` lines
            payload = line[5:].strip()
            if payload == "[DONE]":
                record.done = True
                return
            if not _on_event(json.loads(payload), record, time.perf_counter() - start):
                return


def _on_event(event: Any, record: RequestRecord, now: float) -> bool:
    """Account one SSE event; False stops reading (the server reported an error)."""
    if not isinstance(event, dict):
        return True
    if "error" in event:
        record.error = STREAM_ERROR
        record.error_detail = json.dumps(event["error"])[:200]
        return False
    usage = event.get("usage")
    if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
        record.usage_output_tokens = int(usage["completion_tokens"])
        record.prompt_tokens = usage.get("prompt_tokens")
    timings = event.get("timings")
    if isinstance(timings, dict):  # llama-server's and Outpost's; the last chunk that has them wins
        record.prompt_n = _count(timings.get("prompt_n"))
        record.cache_n = _count(timings.get("cache_n"))
        record.draft_n = _count(timings.get("draft_n"))
        record.draft_n_accepted = _count(timings.get("draft_n_accepted"))
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        text = delta.get("content") or delta.get("reasoning_content") or choice.get("text")
        if text:  # the role chunk and empty deltas are not tokens
            record.chunks += 1
            record.ttft_s = now if record.ttft_s is None else record.ttft_s
            record.last_token_s = now
        record.finish_reason = choice.get("finish_reason") or record.finish_reason
    return True


def _count(value: Any) -> int | None:
    """A token count from a server's JSON; anything that is not a whole number is None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _check_complete(record: RequestRecord, body: dict[str, Any]) -> None:
    """A stream without finish_reason and [DONE] was cut; one that stopped short although the
    server accepted ignore_eos/min_tokens did not run the workload it was given."""
    if not record.done or record.finish_reason is None or record.ttft_s is None:
        record.error = INCOMPLETE
        record.error_detail = (
            f"finish_reason={record.finish_reason} done={record.done} chunks={record.chunks}"
        )
        return
    forced = body.get("ignore_eos") or body.get("min_tokens")
    if forced and record.finish_reason != "length" and record.output_tokens < record.max_tokens:
        record.error = SHORT_OUTPUT
        record.error_detail = f"{record.output_tokens} of {record.max_tokens} tokens ({record.finish_reason})"
