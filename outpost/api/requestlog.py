"""Per-request bookkeeping: the outermost ASGI middleware that counts, logs and gates requests.

For every HTTP request it creates a `RequestRecord` (routes fill in ids, tokens, timings), refuses
new work with 503 while the server drains, counts `outpost_requests_total{endpoint,status}`, tracks
the in-flight count that a graceful shutdown waits on, and writes one JSON line to the
`outpost.access` logger when the reply is done. Prompt and completion text appear in that line only
with `--log-prompts`; API keys never do.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from outpost.api.errors import Envelopes, not_ready
from outpost.api.pipeline.generation import CLIENT_CLOSED
from outpost.api.record import RECORD_KEY, RequestRecord
from outpost.api.state import ServerState
from outpost.api.tracespans import begin_request, end_request
from outpost.tracing import Tracer, current

access_log = logging.getLogger("outpost.access")

# Probes and scrapes: never refused while draining, not counted as in flight, logged only on failure.
QUIET_PATHS = frozenset({"/health", "/v1/health", "/ping", "/metrics"})


def endpoint_label(path: str, known: frozenset[str]) -> str:
    """The route path for metrics labels; unknown paths share one label (no label explosion)."""
    if path in known:
        return path
    return "/v1/models/{model_id}" if path.startswith("/v1/models/") else "other"


class RequestLogMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        state: ServerState,
        known_paths: frozenset[str],
        tracer: Tracer | None = None,
        envelopes: Envelopes | None = None,
    ) -> None:
        self.app = app
        self.envelopes = envelopes or Envelopes()
        self.state = state
        self.known = known_paths
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        quiet = path in QUIET_PATHS
        record = RequestRecord()
        scope[RECORD_KEY] = record
        status = 500
        started = time.monotonic()
        span = begin_request(self.tracer, scope) if self.tracer is not None and not quiet else None
        trace_token = current.set(span.context) if span is not None else None

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                if record.id:
                    message.setdefault("headers", [])
                    message["headers"] = [*message["headers"], (b"x-request-id", record.id.encode())]
            await send(message)

        if not quiet:
            self.state.inflight += 1
        try:
            if not quiet and self.state.status == "draining":
                await self.envelopes.response(path, not_ready("draining"))(scope, receive, send_wrapper)
            else:
                await self.app(scope, receive, send_wrapper)
        finally:
            if not quiet:
                self.state.inflight -= 1
            self.state.metrics.requests.labels(endpoint_label(path, self.known), str(status)).inc()
            if not quiet or status >= 400:
                self._log(scope, record, status, time.monotonic() - started)
            if span is not None and self.tracer is not None:
                end_request(self.tracer, span, record, status)
            if trace_token is not None:
                current.reset(trace_token)

    def _log(self, scope: Scope, record: RequestRecord, status: int, seconds: float) -> None:
        line: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "id": record.id or None,
            "method": scope.get("method"),
            "path": scope["path"],
            "status": status,
            "ms": round(seconds * 1000.0, 1),
        }
        if record.prompt_tokens or record.completion_tokens:
            line.update(
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                cached_tokens=record.cached_tokens,
                finish_reason=record.finish_reason,
                timings=record.timings,
            )
        if record.cancelled or status == CLIENT_CLOSED:
            line["cancelled"] = True  # the client went away: its request was aborted, no error
        if record.prompt is not None:
            line["prompt"] = record.prompt
        if record.completion is not None:
            line["completion"] = record.completion
        access_log.info(json.dumps(line, ensure_ascii=False))
