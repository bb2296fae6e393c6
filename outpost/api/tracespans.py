"""The spans of one HTTP request (only with --otlp-endpoint).

`http receive` (`Tracer.request_span`) covers the request from its first byte to its reply's last,
under the client's `traceparent` (or a new trace); while it runs, `outpost.tracing.current` holds
its context, so code serving the request (a gateway publishing it to a broker) can pass it on.
Each generation in it adds `queue wait`, `prefill` and `decode`, derived from its engine timings at
the end (unless `Tracer.engine_phases` is off). Called by the request-log middleware twice per
request, never per token."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from outpost.api.record import RequestRecord
from outpost.tracing import Span, Tracer, from_asgi_scope

_log = logging.getLogger("outpost.tracing")


def begin_request(tracer: Tracer, scope: Mapping[str, Any]) -> Span | None:
    """The request's `http receive` span, begun now; a tracing failure is logged, never raised."""
    try:
        span = tracer.begin(tracer.request_span, from_asgi_scope(scope), time.time_ns(), kind="server")
        span.set({"http.request.method": scope.get("method"), "url.path": scope.get("path")})
        return span
    except Exception:
        _log.exception("could not begin a request's span")
        return None


def end_request(tracer: Tracer, span: Span, record: RequestRecord, status: int) -> None:
    """Add the engine phases of each generation and end the request's span."""
    try:
        if tracer.engine_phases:
            for timings, finished_ns in record.finished:
                tracer.record_engine_phases(span.context, timings, finished_ns)
        attributes = {
            "http.response.status_code": status,
            "outpost.request_id": record.id or None,
            "gen_ai.usage.input_tokens": record.prompt_tokens or None,
            "gen_ai.usage.output_tokens": record.completion_tokens or None,
        }
        span.end(time.time_ns(), attributes, error=status >= 500)
    except Exception:
        _log.exception("could not record the spans of request %s", record.id)
