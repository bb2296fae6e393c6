"""A fake OpenAI-compatible server on loopback for `outpost bench` tests: streams tokens at planted
delays, injects faults on chosen requests, and records what it received and when.

Tokens are whitespace-separated words (its `/tokenize` counts words), so prompt lengths are
checkable. Token i of a stream is sent at `ttft + i * itl` after the request arrived, against the
clock rather than after each sleep, so scheduler jitter does not accumulate into the planted ITL.
Faults are keyed by the n-th completion request received (0 is the bench's probe).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from benchmarks.harness.ports import free_port
from outpost.bench.config import BenchConfig, make_plan, make_scenario, make_targets
from outpost.bench.progress import Progress
from outpost.bench.records import BenchResult
from outpost.bench.runner import run_bench_sync


@dataclass
class Received:
    n: int
    at: float  # time.perf_counter() on arrival
    body: dict[str, Any]
    auth: str | None


@dataclass
class FakeConfig:
    ttft: float = 0.15
    itl: float = 0.03
    tokens_per_chunk: int = 1
    tokenize: str | None = "llama.cpp"  # "llama.cpp", "vllm" or None (no /tokenize)
    reject: frozenset[str] = frozenset()  # body fields answered with 400, as OpenAI does
    # n -> "500" "429" "drop" "truncate" "stream_error" "short" "slow" (3 s more before the first token)
    faults: dict[int, str] = field(default_factory=dict)
    # llama-server's `timings` on the finish chunk (prompt_n, cache_n, ...); None: not sent
    timings: dict[str, Any] | None = None


def _is_probe(body: dict[str, Any]) -> bool:
    text = body["messages"][-1]["content"] if "messages" in body else body.get("prompt")
    return body.get("max_tokens") == 2 and text == "Hello"


class FakeServer:
    """`with FakeServer(FakeConfig(...)) as fake:` serves on `fake.url` from a thread."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.received: list[Received] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        routes = [
            Route("/v1/models", self._models),
            Route("/tokenize", self._tokenize, methods=["POST"]),
            Route("/v1/chat/completions", self._complete, methods=["POST"]),
            Route("/v1/completions", self._complete, methods=["POST"]),
        ]
        cfg = uvicorn.Config(Starlette(routes=routes), host="127.0.0.1", port=self.port, log_level="critical")
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)

    def measured(self) -> list[Received]:
        """Completion requests other than the bench's probes (a 2-token "Hello")."""
        return [r for r in self.received if not _is_probe(r.body)]

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})

    async def _tokenize(self, request: Request) -> Response:
        body = await request.json()
        shape = self.config.tokenize
        if shape == "llama.cpp" and "content" in body:
            return JSONResponse({"tokens": list(range(len(body["content"].split())))})
        if shape == "vllm" and "prompt" in body and "content" not in body:
            return JSONResponse({"tokens": list(range(len(body["prompt"].split()))), "count": 0})
        return JSONResponse({"error": "no"}, status_code=404 if shape is None else 400)

    async def _complete(self, request: Request) -> Response:
        arrived = time.perf_counter()
        body = await request.json()
        if body.get("model") != "fake-model":
            return JSONResponse({"error": {"message": "no such model"}}, status_code=404)
        rejected = self.config.reject & body.keys()
        if rejected:
            return JSONResponse({"error": {"message": f"unknown {sorted(rejected)}"}}, status_code=400)
        with self._lock:
            n = len(self.received)
            self.received.append(Received(n, arrived, body, request.headers.get("authorization")))
        fault = self.config.faults.get(n, "")
        if fault in ("500", "429"):
            return JSONResponse({"error": {"message": "planted", "code": fault}}, status_code=int(fault))
        stream = self._stream(body, arrived, fault, chat=request.url.path.endswith("chat/completions"))
        return StreamingResponse(stream, media_type="text/event-stream")

    def _chunk(self, text: str | None, finish: str | None, chat: bool) -> bytes:
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text} if text else {}}
        else:
            choice = {"index": 0, "text": text or ""}
        choice["finish_reason"] = finish
        event: dict[str, Any] = {"choices": [choice]}
        if finish and self.config.timings is not None:
            event["timings"] = self.config.timings
        return b"data: " + json.dumps(event).encode() + b"\n\n"

    async def _stream(
        self, body: dict[str, Any], arrived: float, fault: str, chat: bool
    ) -> AsyncIterator[bytes]:
        cfg = self.config
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if chat:  # a role chunk first, no content: not a token
                yield b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
            n = int(body.get("max_tokens") or 16)
            stop_at = n // 2 if fault in ("drop", "truncate", "stream_error", "short") else n
            sent = 0
            if fault == "slow":
                arrived += 3.0
            while sent < stop_at:
                k = min(cfg.tokens_per_chunk, stop_at - sent)
                await asyncio.sleep(
                    max(0.0, arrived + cfg.ttft + (sent + k - 1) * cfg.itl - time.perf_counter())
                )
                sent += k
                yield self._chunk(" ".join(["tok"] * k), None, chat)
            if fault == "drop":
                raise ConnectionAbortedError("planted: connection dropped mid-stream")
            if fault == "truncate":
                return
            if fault == "stream_error":
                yield b'data: {"error":{"message":"planted","code":500}}\n\n'
            else:
                yield self._chunk(None, "stop" if fault == "short" else "length", chat)
                usage = {"prompt_tokens": 1, "completion_tokens": sent, "total_tokens": sent + 1}
                if (body.get("stream_options") or {}).get("include_usage"):
                    yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        finally:
            with self._lock:
                self.in_flight -= 1


def bench(
    urls: list[str],
    concurrency: str | None,
    requests: int | None,
    output: int = 16,
    *,
    rate: str | None = None,
    duration: float | None = None,
    scenario: str = "custom",
    input_tokens: str | None = "12",
    endpoint: Literal["chat", "completions"] = "chat",
    seed: int = 7,
    timeout: float = 30.0,
) -> BenchResult:
    """Run `outpost bench` in-process against `urls` (the first is --url), no warmup."""
    config = BenchConfig(
        targets=make_targets(urls[0], urls[1:], None),
        plan=make_plan(concurrency, rate, requests, duration, 0),
        scenario=make_scenario(scenario, input_tokens, str(output) if output else None),
        endpoint=endpoint,
        seed=seed,
        timeout=timeout,
    )
    return run_bench_sync(config, Progress())
