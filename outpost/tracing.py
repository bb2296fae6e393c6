"""Distributed tracing: the W3C trace context in, OpenTelemetry spans out (only with --otlp-endpoint).

A request's trace starts at the client's `traceparent` header when it sends a valid one, else a new
trace. `TraceContext` is that header parsed: plain strings that travel anywhere (HTTP headers, AMQP
message headers via `inject` / `extract`) without OpenTelemetry being loaded. `Tracer` exports
spans over OTLP/HTTP with OpenTelemetry's SDK; it is built only when an endpoint is configured,
so a server without one imports none of it and makes no tracing call at all. Spans are recorded
with explicit timestamps (`begin` / `end`, or `record` after the fact) because the engine's phases
(queue wait, prefill, decode) are known from a request's `Timings` only when it has finished: no
tracer call runs per token.
"""

from __future__ import annotations

import logging
import re
import secrets
from collections.abc import Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from outpost.messages import Timings

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# version "00": 32 hex trace id, 16 hex parent id, 2 hex flags. Later versions may append fields
# after the flags (the spec says: parse the first four, ignore the rest); version ff is invalid.
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_log = logging.getLogger("outpost.tracing")


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context: the trace, the span that is the parent of the next one, and its flags."""

    trace_id: str  # 32 lowercase hex digits, not all zero
    span_id: str  # 16 lowercase hex digits, not all zero
    flags: int = 1  # bit 0: sampled
    tracestate: str | None = None

    @classmethod
    def parse(cls, traceparent: str | None, tracestate: str | None = None) -> TraceContext | None:
        """The context a `traceparent` header names, or None if it is missing or malformed."""
        if not traceparent:
            return None
        m = _TRACEPARENT.match(traceparent.strip())
        if m is None:
            return None
        version, trace_id, span_id, flags, rest = m.groups()
        if version == "ff" or (version == "00" and rest) or set(trace_id) == {"0"} or set(span_id) == {"0"}:
            return None
        return cls(trace_id, span_id, int(flags, 16), tracestate or None)

    @classmethod
    def new(cls) -> TraceContext:
        """A new trace (random ids, sampled) with no parent span of its own."""
        return cls(secrets.token_hex(16), secrets.token_hex(8))

    @property
    def sampled(self) -> bool:
        return bool(self.flags & 1)

    @property
    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


# The span of the HTTP request being served in this task (set by the API's request-log
# middleware when tracing is on): what a gateway passes on to the worker in the AMQP headers.
current: ContextVar[TraceContext | None] = ContextVar("outpost_trace", default=None)


def inject(headers: MutableMapping[str, Any], ctx: TraceContext | None) -> None:
    """Put `ctx` into a header dict (AMQP message headers, HTTP headers); None puts nothing."""
    if ctx is None:
        return
    headers[TRACEPARENT] = ctx.traceparent
    if ctx.tracestate:
        headers[TRACESTATE] = ctx.tracestate


def extract(headers: Mapping[str, Any] | None) -> TraceContext | None:
    """The context in a header dict (names case-insensitive; bytes or str values), or None."""
    if not headers:
        return None
    found: dict[str, str] = {}
    for key, value in headers.items():
        name = (key.decode("latin-1") if isinstance(key, bytes) else str(key)).lower()
        if name in (TRACEPARENT, TRACESTATE):
            found[name] = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return TraceContext.parse(found.get(TRACEPARENT), found.get(TRACESTATE))


def from_asgi_scope(scope: Mapping[str, Any]) -> TraceContext | None:
    """The client's trace context from an ASGI HTTP scope's raw headers."""
    return extract(dict(scope.get("headers") or ()))


def otlp_traces_url(endpoint: str) -> str:
    """OTLP/HTTP's traces URL for a collector's base URL (as OTEL_EXPORTER_OTLP_ENDPOINT is read)."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class Span:
    """A span begun at an explicit time; `context` names it as a parent before it ends."""

    def __init__(self, otel_span: Any) -> None:
        self._span = otel_span
        sc = otel_span.get_span_context()
        self.context = TraceContext(f"{sc.trace_id:032x}", f"{sc.span_id:016x}", int(sc.trace_flags), None)

    def set(self, attributes: Mapping[str, Any]) -> None:
        self._span.set_attributes({k: v for k, v in attributes.items() if v is not None})

    def end(self, end_ns: int, attributes: Mapping[str, Any] | None = None, error: bool = False) -> None:
        from opentelemetry.trace import Status, StatusCode

        if attributes:
            self.set(attributes)
        if error:
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end(end_time=end_ns)


class Tracer:
    """Spans of one process (`service` names it) exported in batches to an OTLP/HTTP collector."""

    def __init__(
        self,
        endpoint: str,
        service: str,
        export_delay_ms: int = 1000,
        request_span: str = "http receive",
        engine_phases: bool = True,
    ) -> None:
        """`request_span` names each HTTP request's span; `engine_phases=False` leaves the queue
        wait / prefill / decode spans to another process (a gateway's workers record their own)."""
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        # The provider flushes its batch at interpreter exit (shutdown_on_exit), so a drained
        # server's last spans still go out.
        self._provider = TracerProvider(resource=Resource.create({"service.name": service}))
        exporter = OTLPSpanExporter(endpoint=otlp_traces_url(endpoint), timeout=10)
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=export_delay_ms))
        self._tracer = self._provider.get_tracer("outpost")
        self.endpoint = endpoint
        self.request_span = request_span
        self.engine_phases = engine_phases

    def begin(self, name: str, parent: TraceContext | None, start_ns: int, kind: str = "internal") -> Span:
        """Start a span at `start_ns` (time.time_ns()) under `parent` (None: a new trace)."""
        from opentelemetry import trace

        context = None
        if parent is not None:
            remote = trace.SpanContext(
                int(parent.trace_id, 16),
                int(parent.span_id, 16),
                is_remote=True,
                trace_flags=trace.TraceFlags(parent.flags),
                trace_state=trace.TraceState.from_header([parent.tracestate]) if parent.tracestate else None,
            )
            context = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        span_kind = {
            "server": trace.SpanKind.SERVER,
            "client": trace.SpanKind.CLIENT,
            "producer": trace.SpanKind.PRODUCER,
            "consumer": trace.SpanKind.CONSUMER,
        }.get(kind, trace.SpanKind.INTERNAL)
        otel_span = self._tracer.start_span(name, context=context, kind=span_kind, start_time=start_ns)
        return Span(otel_span)

    def record(
        self,
        name: str,
        parent: TraceContext | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any] | None = None,
        kind: str = "internal",
    ) -> TraceContext:
        """A finished span, recorded after the fact; returns its context."""
        span = self.begin(name, parent, start_ns, kind)
        span.end(max(start_ns, end_ns), attributes)
        return span.context

    def record_engine_phases(self, parent: TraceContext, timings: Timings, finished_ns: int) -> None:
        """`queue wait`, `prefill` and `decode` spans under `parent`, laid out backwards from the
        request's end with its engine timings (the engine measures them, not the tracer)."""
        decode_start = finished_ns - int(timings.predicted_ms * 1e6)
        prefill_start = decode_start - int(timings.prompt_ms * 1e6)
        queue_start = prefill_start - int(timings.queue_ms * 1e6)
        self.record("queue wait", parent, queue_start, prefill_start, {"outpost.queue_ms": timings.queue_ms})
        self.record(
            "prefill",
            parent,
            prefill_start,
            decode_start,
            {"outpost.prompt_n": timings.prompt_n, "outpost.cache_n": timings.cache_n},
        )
        self.record("decode", parent, decode_start, finished_ns, {"outpost.predicted_n": timings.predicted_n})

    def flush(self, timeout_ms: int = 10_000) -> bool:
        return bool(self._provider.force_flush(timeout_ms))

    def shutdown(self) -> None:
        self._provider.shutdown()


def tracer_for(endpoint: str | None, service: str) -> Tracer | None:
    """A Tracer when an OTLP endpoint is configured; None (tracing off, nothing loaded) otherwise."""
    if not endpoint:
        return None
    _log.info("exporting spans to %s", otlp_traces_url(endpoint))
    return Tracer(endpoint, service)
