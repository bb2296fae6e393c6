"""Speculative decoding's interfaces: the request fields over HTTP, timings, /metrics, the wire,
and the serve/worker flags (llama-server's spellings)."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.cluster import wire
from outpost.messages import FinishReason, GenerateRequest, SpecParams, SpecRequest, Timings, TokenEvent
from outpost.settings import EngineSettings, HttpSettings

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture()
def config() -> HttpSettings:
    return HttpSettings()


def _post(config: HttpSettings, backend: FakeBackend, body: dict[str, Any]) -> tuple[httpx.Response, str]:
    async def main() -> tuple[httpx.Response, str]:
        app = create_app({"m": backend}, config, "m")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            reply = await client.post("/v1/chat/completions", json=body)
            metrics = (await client.get("/metrics")).text
            return reply, metrics

    return asyncio.run(main())


def test_llama_server_flat_fields_reach_the_engine_and_counts_come_back(config: HttpSettings) -> None:
    backend = FakeBackend("hello")
    backend.draft_counts = (40, 30)
    body = {**CHAT, "speculative.type": "ngram-mod", "speculative.n_max": 8, "speculative.n_min": 2}
    reply, metrics = _post(config, backend, body)
    assert reply.status_code == 200, reply.text
    assert backend.submitted[0].speculative == SpecRequest("ngram-mod", 8, 2)
    timings = reply.json()["timings"]
    assert (timings["draft_n"], timings["draft_n_accepted"], timings["draft_acceptance"]) == (40, 30, 0.75)
    assert "outpost_draft_tokens_total 40.0" in metrics
    assert "outpost_draft_accepted_tokens_total 30.0" in metrics


def test_the_object_form_and_no_field_at_all(config: HttpSettings) -> None:
    backend = FakeBackend("hello")
    reply, _ = _post(config, backend, {**CHAT, "speculative": {"type": "none"}})
    assert reply.status_code == 200
    assert backend.submitted[0].speculative == SpecRequest("none")
    assert "draft_n" not in reply.json()["timings"]  # as llama-server: only where it speculated
    reply, _ = _post(config, backend, CHAT)
    assert backend.submitted[1].speculative is None


@pytest.mark.parametrize(
    "extra",
    [{"speculative.type": "eagle"}, {"speculative.n_max": 9999}, {"speculative": {"n_max": 2, "n_min": 5}}],
)
def test_bad_speculative_fields_are_a_4xx(config: HttpSettings, extra: dict[str, Any]) -> None:
    reply, _ = _post(config, FakeBackend("hello"), {**CHAT, **extra})
    assert reply.status_code in (400, 422), reply.text
    assert "error" in reply.json()


def test_the_override_and_the_counts_cross_the_wire() -> None:
    now = time.monotonic()
    req = GenerateRequest([1, 2], 5, arrival_time=now, speculative=SpecRequest(n_max=4))
    back = wire.decode_request(wire.encode_request(req))
    assert back.speculative == SpecRequest(None, 4, None)
    assert (
        wire.decode_request(wire.encode_request(GenerateRequest([1], 2, arrival_time=now))).speculative
        is None
    )
    timings = Timings(prompt_n=3, predicted_n=5, draft_n=12, draft_n_accepted=9)
    event = TokenEvent("r", [7], "x", FinishReason.STOP, timings)
    batch = wire.decode_batch(wire.encode_batch(wire.ReplyBatch("r", 0, 0, [event])))
    got = batch.events[0].timings
    assert got is not None and (got.draft_n, got.draft_n_accepted) == (12, 9)


def test_flags_with_llama_server_spellings(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    p = argparse.ArgumentParser()
    EngineSettings.add_to(p)

    def settings(*argv: str) -> EngineSettings:
        return EngineSettings.from_args(p.parse_args(list(argv)))

    # -md alone means the draft type
    assert settings("-md", str(model), "--spec-draft-n-max", "8", "--spec-draft-n-min", "1").speculative == (
        SpecParams("draft", 8, 1)
    )
    assert settings("--spec-type", "ngram-simple").speculative == SpecParams("ngram-simple", 16, 0)
    assert settings().speculative == SpecParams("none", 16, 0)
    assert p.parse_args(["--spec-type", "draft-simple"]).spec_type == "draft"
    with pytest.raises(SystemExit):
        p.parse_args(["--spec-type", "ngram-cache"])
    with pytest.raises(ValueError, match="draft model"):
        settings("--spec-type", "draft")
    with pytest.raises(ValueError, match="n-min"):
        settings("--spec-type", "ngram-mod", "--spec-draft-n-max", "2", "--spec-draft-n-min", "3")


def test_outpost_bench_records_the_draft_counts() -> None:
    from outpost.bench.client import _on_event
    from outpost.bench.records import RequestRecord
    from outpost.bench.stats import summarise

    records = []
    for i, (drafted, accepted) in enumerate([(10, 8), (6, 3)]):
        record = RequestRecord(i, 0.0, 5, 4)
        event = {"choices": [{"delta": {"content": "x"}, "finish_reason": "stop"}]}
        event["timings"] = {"prompt_n": 5, "cache_n": 0, "draft_n": drafted, "draft_n_accepted": accepted}
        assert _on_event(event, record, 0.1)
        records.append(record)
    assert (records[0].draft_n, records[0].draft_n_accepted) == (10, 8)
    for r in records:
        r.e2e_s = 0.2
    summary = summarise(records, label="s", url="u", model="m", mode="concurrency", level=1, capped=False)
    assert (summary.draft_n, summary.draft_n_accepted, summary.draft_acceptance) == (16, 11, 11 / 16)
    assert summary.summary_entry()["draft_acceptance"] == 11 / 16
