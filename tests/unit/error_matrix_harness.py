"""What the error matrix (test_error_matrix.py) drives: every generating route, an ASGI client, a gateway.

`ROUTES` names each generating route with its body, the fields its protocol calls the prompt and the
output budget, and how its error envelope and its stream's error event look. `call` drives the app
over raw ASGI (as uvicorn does: spec 2.3), so a test can hang up at a chosen moment. `gateway_backend`
is a gateway's `RemoteBackend` with no broker: its link hands each request (through the wire's
encoding) to a cluster worker's own request code (`BackendRequests`) over a `FakeBackend`, and the
worker's replies back through the wire, so a worker's refusal reaches the API as the very event
a worker sends.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fake_backend import FakeBackend

from outpost.cluster import wire
from outpost.cluster.gateway.inflight import Pending
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.worker.cancels import CancelMemory
from outpost.cluster.worker.requests import BackendRequests
from outpost.messages import FimTokens, GenerateRequest

Body = Callable[[str, Any], dict[str, Any]]  # (prompt text, budget) -> the request body


@dataclass(frozen=True)
class Route:
    """One generating route as its protocol speaks it."""

    id: str
    path: str
    body: Body
    prompt: str  # what the protocol calls the prompt and the budget: its errors must name them
    budget: str
    envelope: str  # "openai" | "llama" | "anthropic" | "responses" | "ollama"
    streams: bool = True
    stream_key: dict[str, Any] = field(default_factory=lambda: {"stream": True})
    still: dict[str, Any] = field(default_factory=dict)  # what a reply that is not streamed adds


def _chat(text: str, budget: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], "max_tokens": budget}


def _messages(text: str, budget: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": budget}


def _ollama_chat(text: str, budget: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}], "options": {"num_predict": budget}}


def _ollama_generate(text: str, budget: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": text, "options": {"num_predict": budget}}


def _infill(text: str, budget: Any) -> dict[str, Any]:
    return {"input_prefix": text, "input_suffix": "", "n_predict": budget}


ROUTES = [
    Route("chat", "/v1/chat/completions", _chat, "messages", "max_tokens", "openai"),
    Route("completions", "/v1/completions", lambda t, b: {"prompt": t, "max_tokens": b}, "prompt",
          "max_tokens", "openai"),
    Route("responses", "/v1/responses", lambda t, b: {"input": t, "max_output_tokens": b}, "input",
          "max_output_tokens", "responses"),
    Route("messages", "/v1/messages", _messages, "messages", "max_tokens", "anthropic"),
    Route("completion", "/completion", lambda t, b: {"prompt": t, "n_predict": b}, "prompt", "n_predict",
          "llama"),
    Route("completions-native", "/completions", lambda t, b: {"prompt": t, "n_predict": b}, "prompt",
          "n_predict", "llama"),
    Route("infill", "/infill", _infill, "prompt", "n_predict", "llama"),
    Route("invocations-tgi", "/invocations", lambda t, b: {"inputs": t, "parameters": {"max_new_tokens": b}},
          "inputs", "max_new_tokens", "openai", streams=False),
    Route("invocations-chat", "/invocations", _chat, "messages", "max_tokens", "openai"),
    Route("ollama-chat", "/api/chat", _ollama_chat, "messages", "num_predict", "ollama",
          still={"stream": False}),
    Route("ollama-generate", "/api/generate", _ollama_generate, "prompt", "num_predict", "ollama",
          still={"stream": False}),
]  # fmt: skip


def request_body(route: Route, text: str, budget: Any, streamed: bool) -> dict[str, Any]:
    return {**route.body(text, budget), **(route.stream_key if streamed else route.still)}


def fim_ready(backend: FakeBackend) -> FakeBackend:
    """`backend` with fill-in-the-middle tokens, so /infill serves (FakeCodec's code points above text)."""
    backend.codec.fim_tokens = FimTokens(pre=0x10FF00, suf=0x10FF01, mid=0x10FF02)  # type: ignore[misc]
    return backend


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    started: asyncio.Event  # set when the reply's headers went out
    raised: Exception | None = None  # what the app raised after its reply (Starlette re-raises a 500's)
    task: Any = None

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


async def call(app: Any, path: str, body: dict[str, Any], hang_up: Callable[[Reply], bool] | None = None,
               timeout: float = 20.0) -> Reply:  # fmt: skip
    """POST `body` to `path` over raw ASGI; with `hang_up`, the client goes away once it says so."""
    reply = Reply(0, {}, b"", asyncio.Event())
    gone = asyncio.Event()
    sent_request = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = {k.decode().lower(): v.decode() for k, v in message.get("headers", [])}
            reply.started.set()
        elif message["type"] == "http.response.body":
            reply.body += message.get("body", b"")

    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": [(b"content-type", b"application/json"), (b"host", b"test")],
        "client": ("127.0.0.1", 1234), "server": ("test", 80),
    }  # fmt: skip
    task = asyncio.ensure_future(app(scope, receive, send))
    reply.task = task
    if hang_up is not None:
        for _ in range(int(timeout * 100)):  # bounded
            if task.done() or hang_up(reply):
                break
            await asyncio.sleep(0.01)
        gone.set()
    try:
        await asyncio.wait_for(task, timeout)
    except Exception as exc:  # re-raised after the 500 went out, as Starlette does for the server's log
        if not reply.started.is_set():
            raise
        reply.raised = exc
    return reply


def data_lines(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def sse_events(text: str) -> list[tuple[str | None, Any]]:
    """(event name or None, data) per SSE event; `[DONE]` as the string."""
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        name = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                raw = line[6:]
                out.append((name, raw if raw == "[DONE]" else json.loads(raw)))
    return out


class StubLink:
    """A `GatewayLink` with no broker: one worker (a `FakeBackend`) that joins when `live` is set."""

    def __init__(self, worker: FakeBackend, live: bool) -> None:
        self.worker = worker
        self.live = live
        self.requests = BackendRequests(worker, "w1", CancelMemory(), lambda: 1e9)
        self.tasks: dict[str, asyncio.Task[Any]] = {}
        self.cancelled: list[str] = []
        self.models = ["m"]
        self.depths: dict[str, int] = {}
        self.connected = True
        self.counters: dict[str, int] = {}

    def n_ctx_seq(self, model: str) -> int | None:
        return self.worker.n_ctx_seq if self.live else None  # what live workers' heartbeats say

    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        stats = self.worker.stats()
        worker = {"model": "m", "slots_total": stats.slots_total, "slots_busy": stats.slots_busy,
                  "kv_cells": stats.kv_cells_total}  # fmt: skip
        return [worker] if self.live else []

    async def submit(self, model: str, request: GenerateRequest) -> Pending:
        pending = Pending(request, model)
        taken = wire.decode_request(wire.encode_request(request))  # what the worker reads

        async def send(batch: wire.ReplyBatch) -> None:
            for event in wire.decode_batch(wire.encode_batch(batch)).events:  # what the gateway reads
                pending.events.put_nowait(event)

        self.tasks[request.request_id] = asyncio.ensure_future(self.requests.generate(taken, send, 0, 0))
        return pending

    async def cancel(self, request_id: str) -> None:
        """The gateway's cancel reaching the worker: it aborts the request, freeing its slot."""
        self.cancelled.append(request_id)
        await self.worker.abort(request_id)
        task = self.tasks.get(request_id)
        if task is not None and not task.done():
            task.cancel()


def gateway_backend(
    worker: FakeBackend, live: bool, n_ctx_train: int = 4096
) -> tuple[RemoteBackend, StubLink]:
    """A gateway's backend for model "m" over one worker; `live`: the worker joined before the request
    (else the gateway knows only the model's trained context, `n_ctx_train`)."""
    link = StubLink(worker, live)
    remote = RemoteBackend(link, "m", worker.codec, {"n_ctx_train": n_ctx_train})  # type: ignore[arg-type]
    return remote, link


class CrashingBackend(FakeBackend):
    """A backend whose stream raises (an engine bug, not a failure it reports as an ERROR event)."""

    async def submit(self, request: GenerateRequest) -> Any:
        stream = await super().submit(request)
        return _Crashing(stream)


class _Crashing:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.request_id = stream.request_id

    async def __aiter__(self) -> Any:
        raise RuntimeError("the engine crashed")
        yield  # an async generator

    async def aclose(self) -> None:
        await self.stream.aclose()
