"""`outpost serve --otlp-endpoint`: each request becomes one trace in a real OTLP collector (rotel)."""

from __future__ import annotations

from pathlib import Path

from otlp_collector import CollectedSpan, Collector
from server_harness import sse_events, start

from outpost.tracing import TraceContext

PHASES = {"queue wait", "prefill", "decode"}


def by_trace(spans: list[CollectedSpan], trace_id: str) -> dict[str, CollectedSpan]:
    found = [s for s in spans if s.trace_id == trace_id]
    named = {s.name: s for s in found}
    assert len(named) == len(found), f"a span name repeats in {found}"
    return named


def check_request_trace(named: dict[str, CollectedSpan], request_id: str, completion_tokens: int) -> None:
    assert set(named) == {"http receive", *PHASES}, named
    root = named["http receive"]
    assert root.service == "outpost" and root.kind == "SPAN_KIND_SERVER"
    assert root.attributes["outpost.request_id"] == request_id
    assert root.attributes["http.response.status_code"] == "200"
    for name in PHASES:
        span = named[name]
        assert span.parent_id == root.span_id, (name, span)
        assert root.start_ns <= span.start_ns <= span.end_ns <= root.end_ns, (name, span, root)
    # The phases follow one another: queue wait, then prefill, then decode.
    assert named["queue wait"].end_ns == named["prefill"].start_ns
    assert named["prefill"].end_ns == named["decode"].start_ns
    assert named["decode"].attributes["outpost.predicted_n"] == str(completion_tokens)


def test_serve_exports_a_trace_per_request(tiny_model: Path, otlp_collector: Collector) -> None:
    client_ctx = TraceContext.new()
    server = start(tiny_model, "--otlp-endpoint", otlp_collector.http_endpoint)
    with server, server.client() as http:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        r = http.post("/v1/chat/completions", json=body, headers={"traceparent": client_ctx.traceparent})
        assert r.status_code == 200, r.text
        traced_id, traced_tokens = r.headers["x-request-id"], r.json()["usage"]["completion_tokens"]
        # A streamed request with no trace context of its own starts a new trace.
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        with http.stream("POST", "/v1/chat/completions", json=stream_body) as s:
            assert s.status_code == 200
            events = sse_events(s.iter_lines())
            new_id = s.headers["x-request-id"]
        new_tokens = events[-2]["usage"]["completion_tokens"]
        spans = otlp_collector.wait_spans(
            lambda got: sum(x.name == "http receive" for x in got) >= 2, timeout=60
        )

    named = by_trace(spans, client_ctx.trace_id)
    check_request_trace(named, traced_id, traced_tokens)
    assert named["http receive"].parent_id == client_ctx.span_id  # the client's span is the parent

    roots = [s for s in spans if s.name == "http receive" and s.trace_id != client_ctx.trace_id]
    assert len(roots) == 1, roots
    assert roots[0].parent_id == ""  # a new trace starts here
    check_request_trace(by_trace(spans, roots[0].trace_id), new_id, new_tokens)
    assert len(spans) == 8, spans  # /health polls and the rest make no spans


def test_a_gateway_tracer_names_its_span_and_exposes_it_to_the_handler(
    tiny_model: Path, otlp_collector: Collector
) -> None:
    """What a gateway builds on: its own request span name, no engine phases of its own (its workers
    record them), and `tracing.current` holding the request's span while the request is served."""
    from fastapi.testclient import TestClient

    from outpost.api.app import create_app
    from outpost.settings import HttpSettings
    from outpost.tracing import Tracer, current

    tracer = Tracer(
        otlp_collector.http_endpoint, "outpost-gateway", request_span="gateway receive", engine_phases=False
    )
    app = create_app({}, HttpSettings(), tiny_model.stem, tracer=tracer)  # no backend needed

    async def probe() -> dict[str, str | None]:
        ctx = current.get()
        return {"traceparent": ctx.traceparent if ctx else None}

    app.add_api_route("/trace-probe", probe)
    client_ctx = TraceContext.new()
    with TestClient(app) as http:
        seen = http.get("/trace-probe", headers={"traceparent": client_ctx.traceparent}).json()
        untraced = http.get("/health").status_code  # probes make no spans
    assert untraced == 200
    assert current.get() is None
    tracer.flush()
    spans = otlp_collector.wait_spans(lambda got: len(got) >= 1, timeout=60)
    assert [(s.name, s.service, s.trace_id, s.parent_id) for s in spans] == [
        ("gateway receive", "outpost-gateway", client_ctx.trace_id, client_ctx.span_id)
    ]
    handed_on = TraceContext.parse(seen["traceparent"])
    assert handed_on is not None and handed_on.trace_id == client_ctx.trace_id
    assert handed_on.span_id == spans[0].span_id  # the handler saw the request's own span
    tracer.shutdown()
