"""W3C trace context parsing and its round trip through header dicts (HTTP, AMQP)."""

from __future__ import annotations

import pytest

from outpost.tracing import TraceContext, extract, from_asgi_scope, inject, otlp_traces_url, tracer_for

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_parse_valid_traceparent() -> None:
    ctx = TraceContext.parse(VALID, "congo=t61rcWkgMzE")
    assert ctx == TraceContext("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", 1, "congo=t61rcWkgMzE")
    assert ctx.sampled and ctx.traceparent == VALID
    unsampled = TraceContext.parse(VALID[:-2] + "00")
    assert unsampled is not None and not unsampled.sampled


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",  # no flags
        "00-00000000000000000000000000000000-b7ad6b7169203331-01",  # zero trace id
        "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",  # zero span id
        "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",  # forbidden version
        "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",  # upper case
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",  # v00 has exactly 4 fields
    ],
)
def test_parse_rejects_malformed(value: str | None) -> None:
    assert TraceContext.parse(value) is None


def test_future_version_keeps_the_first_four_fields() -> None:
    ctx = TraceContext.parse("cc-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-what-the-future-holds")
    assert ctx is not None and ctx.trace_id == "0af7651916cd43dd8448eb211c80319c"


def test_new_trace_is_valid_and_random() -> None:
    a, b = TraceContext.new(), TraceContext.new()
    assert TraceContext.parse(a.traceparent) == a
    assert a.trace_id != b.trace_id


def test_inject_extract_round_trip_through_amqp_style_headers() -> None:
    ctx = TraceContext.parse(VALID, "vendor=1")
    headers: dict[str, object] = {"x-attempt": 1}
    inject(headers, ctx)
    assert headers == {"x-attempt": 1, "traceparent": VALID, "tracestate": "vendor=1"}
    assert extract(headers) == ctx
    # AMQP clients may hand header values back as bytes.
    assert extract({b"traceparent": VALID.encode()}) == TraceContext.parse(VALID)
    inject(headers := {}, None)
    assert headers == {} and extract(headers) is None and extract(None) is None


def test_from_asgi_scope_reads_raw_headers_case_insensitively() -> None:
    scope = {"headers": [(b"content-type", b"application/json"), (b"TraceParent", VALID.encode())]}
    assert from_asgi_scope(scope) == TraceContext.parse(VALID)
    assert from_asgi_scope({"headers": []}) is None


def test_otlp_traces_url() -> None:
    assert otlp_traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert otlp_traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert otlp_traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def test_no_endpoint_means_no_tracer() -> None:
    assert tracer_for(None, "x") is None and tracer_for("", "x") is None
