"""A traced request through gateway + RabbitMQ + worker is one trace with spans from both processes."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_harness import Gateway, live, worker
from otlp_collector import Collector

from outpost.tracing import TraceContext

PHASES = {"queue wait", "prefill", "decode"}


def test_one_trace_spans_gateway_and_worker(
    rabbitmq: Any, otlp_collector: Collector, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = tmp_path_factory.mktemp("traced") / "traced-tiny.gguf"  # its own queue
    shutil.copyfile(tiny_model, model)
    endpoint = otlp_collector.http_endpoint
    gateway = Gateway(rabbitmq, [model], "--otlp-endpoint", endpoint)
    work = worker(rabbitmq, model, "-np", "2", "--otlp-endpoint", endpoint)
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        client = TraceContext.new()
        body = {"model": model.stem, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
        r = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            json=body,
            headers={"traceparent": client.traceparent},
            timeout=120,
        )
        assert r.status_code == 200, r.text
        tokens = r.json()["usage"]["completion_tokens"]

        def complete(spans: list[Any]) -> bool:
            names = {s.name for s in spans if s.trace_id == client.trace_id}
            return {"gateway receive", *PHASES} <= names

        spans = [s for s in otlp_collector.wait_spans(complete, timeout=60) if s.trace_id == client.trace_id]
    finally:
        work.stop()
        gateway.stop()
    named = {s.name: s for s in spans}
    root = named["gateway receive"]
    assert root.service == "outpost-gateway" and root.parent_id == client.span_id
    for phase in PHASES:
        assert named[phase].service == "outpost-worker", named[phase]
        assert named[phase].parent_id == root.span_id
    assert named["decode"].attributes["outpost.predicted_n"] == str(tokens)
    assert {s.service for s in spans} == {"outpost-gateway", "outpost-worker"}
