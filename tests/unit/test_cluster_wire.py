"""The cluster wire format: round trips, version checks, no non-finite floats in JSON."""

from __future__ import annotations

import json
import math
import time

import pytest

from outpost.cluster import wire, wire_embed
from outpost.cluster.heartbeat import Heartbeat, decode_heartbeat, encode_heartbeat
from outpost.messages import (
    FinishReason,
    GenerateRequest,
    SamplingParams,
    Timings,
    TokenEvent,
    TokenLogprob,
)


def _request() -> GenerateRequest:
    now = time.monotonic()
    return GenerateRequest(
        prompt_tokens=[1, 2, 3],
        max_tokens=17,
        sampling=SamplingParams(
            temperature=0.0,
            seed=7,
            logit_bias=((5, 2.5), (9, -math.inf)),
            grammar='root ::= "a"',
            n_probs=2,
            ignore_eos=True,
        ),
        stop=("\n\n", "END"),
        request_id="r1",
        deadline=now + 30.0,
        arrival_time=now - 0.25,
        n_resumed=2,
    )


def test_request_round_trip() -> None:
    req = _request()
    body = wire.encode_request(req)
    back = wire.decode_request(body)
    assert back.prompt_tokens == req.prompt_tokens
    assert back.max_tokens == req.max_tokens
    assert back.sampling == req.sampling
    assert back.stop == req.stop
    assert back.request_id == req.request_id
    assert back.n_resumed == 2
    assert back.deadline is not None and req.deadline is not None
    assert abs(back.deadline - req.deadline) < 0.05
    assert abs(back.arrival_time - req.arrival_time) < 0.05


def test_no_deadline_round_trips_as_none() -> None:
    req = GenerateRequest(prompt_tokens=[1], max_tokens=1)
    assert wire.decode_request(wire.encode_request(req)).deadline is None


def test_bans_travel_without_infinity() -> None:
    body = wire.encode_request(_request())
    text = body.decode()
    assert "Infinity" not in text and "NaN" not in text
    obj = json.loads(text)
    json.dumps(obj, allow_nan=False)  # raises on any non-finite float
    assert obj["v"] == wire.WIRE_VERSION
    assert obj["sampling"]["ban"] == [9]
    assert obj["sampling"]["logit_bias"] == [[5, 2.5]]


def test_deadline_is_wall_clock() -> None:
    req = _request()
    obj = json.loads(wire.encode_request(req))
    assert abs(obj["deadline_unix"] - (time.time() + 30.0)) < 1.0
    back = wire.decode_request(wire.encode_request(req)).deadline
    assert back is not None and req.deadline is not None and abs(back - req.deadline) < 0.05


def test_batch_round_trip_with_timings_and_logprobs() -> None:
    events = [
        TokenEvent(
            "r1",
            token_ids=[4, 5],
            text="ab",
            logprobs=[
                TokenLogprob(4, -0.5, ((4, -0.5), (6, -math.inf))),
                TokenLogprob(5, -math.inf, ()),
            ],
        ),
        TokenEvent(
            "r1",
            token_ids=[6],
            text="c",
            finish_reason=FinishReason.LENGTH,
            timings=Timings(3, 1.5, 3, 2.25, 1, 0.5),
        ),
    ]
    batch = wire.ReplyBatch("r1", attempt=1, seq=4, events=events)
    body = wire.encode_batch(batch)
    assert b"Infinity" not in body
    back = wire.decode_batch(body)
    assert back.request_id == "r1" and back.attempt == 1 and back.seq == 4
    assert back.events == events
    assert back.finished


def test_error_event_round_trip() -> None:
    ev = TokenEvent("r2", finish_reason=FinishReason.ERROR, error="poison")
    back = wire.decode_batch(wire.encode_batch(wire.ReplyBatch("r2", 0, 0, [ev])))
    assert back.events == [ev]


def test_version_mismatch_is_a_clear_error() -> None:
    obj = json.loads(wire.encode_request(_request()))
    obj["v"] = 2
    with pytest.raises(wire.WireError, match="wire version 2 is not supported"):
        wire.decode_request(json.dumps(obj).encode())


def test_wrong_kind_and_garbage_are_errors() -> None:
    with pytest.raises(wire.WireError, match="expected a request"):
        wire.decode_request(wire.encode_cancel("x"))
    with pytest.raises(wire.WireError, match="not a JSON"):
        wire.decode_request(b"\xff\x00")
    with pytest.raises(wire.WireError, match="malformed"):
        wire.decode_request(wire.dumps({"kind": "request"}))


def test_resume_and_heartbeat_round_trip() -> None:
    state = wire.ResumeState("r3", attempt=2, seq=7, token_ids=[1, 2, 3])
    assert wire.decode_resume(wire.encode_resume(state)) == state
    hb = Heartbeat(
        "w1",
        "tiny",
        4,
        1,
        lane="outpost.lane.tiny.w1",
        prefixes=("ab" * 8,),
        prefill_tps=512.5,
        cache_blocks=64,
    )
    assert decode_heartbeat(encode_heartbeat(hb)) == hb
    old = wire.dumps({"kind": "heartbeat", "id": "w0", "model": "tiny", "slots_total": 2, "slots_busy": 0})
    assert decode_heartbeat(old) == Heartbeat("w0", "tiny", 2, 0)  # before lanes: no lane, no prefixes
    with pytest.raises(wire.WireError, match="malformed heartbeat"):
        decode_heartbeat(
            wire.dumps(
                {
                    "kind": "heartbeat",
                    "id": "w",
                    "model": "m",
                    "slots_total": 1,
                    "slots_busy": 0,
                    "prefixes": 5,
                }
            )
        )


def test_time_conversion_is_inverse() -> None:
    m, w = 1000.0, 1_700_000_000.0
    assert wire.to_monotonic(wire.to_wall(m + 5, m, w), m, w) == pytest.approx(m + 5)


def test_a_request_without_n_resumed_decodes_as_fresh() -> None:
    """Messages of earlier v1 senders have no n_resumed field."""
    obj = json.loads(wire.encode_request(_request()))
    del obj["n_resumed"]
    assert wire.decode_request(json.dumps(obj).encode()).n_resumed == 0


def test_embed_job_round_trip() -> None:
    deadline = time.monotonic() + 12.0
    job = wire_embed.EmbedJob("e1", ["a red apple", "", "naïve 😀"], deadline=deadline)
    body = wire_embed.encode_embed_job(job)
    assert json.loads(body)["kind"] == "embed"
    obj = json.loads(body)
    assert obj["v"] == wire.WIRE_VERSION and abs(obj["deadline_unix"] - (time.time() + 12.0)) < 1.0
    back = wire_embed.decode_embed_job(body)
    assert back.request_id == "e1" and back.texts == job.texts
    assert back.deadline is not None and abs(back.deadline - deadline) < 0.05
    assert (
        wire_embed.decode_embed_job(wire_embed.encode_embed_job(wire_embed.EmbedJob("e2", ["x"]))).deadline
        is None
    )


def test_embed_reply_round_trip_is_exact() -> None:
    reply = wire_embed.EmbedReply("e1", [[0.1, -0.2, 1 / 3], [1e-300, -0.0, 5e-324]], n_tokens=9)
    body = wire_embed.encode_embed_reply(reply)
    assert json.loads(body)["kind"] == "embedded"
    assert wire_embed.decode_embed_reply(body) == reply  # JSON floats round-trip bit for bit


def test_embed_reply_failures_and_non_finite_values() -> None:
    for failure in wire_embed.EmbedFailure:
        reply = wire_embed.EmbedReply("e3", failure=failure, error=f"{failure.value} went wrong")
        assert wire_embed.decode_embed_reply(wire_embed.encode_embed_reply(reply)) == reply
    odd = wire_embed.EmbedReply("e4", [[math.inf, 1.0]], 1)
    body = wire_embed.encode_embed_reply(odd)
    assert b"Infinity" not in body
    back = wire_embed.decode_embed_reply(body)
    assert back.vectors[0][0] == math.inf and back.failure is None and back.error is None


def test_malformed_embed_messages_are_errors() -> None:
    with pytest.raises(wire.WireError, match="malformed embed message"):
        wire_embed.decode_embed_job(wire.dumps({"kind": "embed", "request_id": "x", "texts": [1, 2]}))
    with pytest.raises(wire.WireError, match="malformed embed message"):
        wire_embed.decode_embed_job(wire.dumps({"kind": "embed", "texts": ["a"]}))
    with pytest.raises(wire.WireError, match="malformed embedded message"):
        wire_embed.decode_embed_reply(
            wire.dumps({"kind": "embedded", "request_id": "x", "vectors": [], "n_tokens": 0, "failure": "?"})
        )
    with pytest.raises(wire.WireError, match="expected a embed"):
        wire_embed.decode_embed_job(wire.encode_request(_request()))
    obj = json.loads(wire_embed.encode_embed_job(wire_embed.EmbedJob("e5", ["x"])))
    obj["v"] = 2
    with pytest.raises(wire.WireError, match="wire version 2"):
        wire_embed.decode_embed_job(json.dumps(obj).encode())


def test_bundle_round_trip_keeps_each_requests_batch() -> None:
    batches = [
        wire.ReplyBatch("a", 0, 3, [TokenEvent("a", token_ids=[7], text="x")]),
        wire.ReplyBatch(
            "b", 2, 0, [TokenEvent("b", finish_reason=FinishReason.STOP, timings=Timings(1, 1, 1, 1))]
        ),
    ]
    body = wire.encode_bundle(batches)
    assert json.loads(body)["kind"] == "bundle"
    back = wire.decode_bundle(body)
    assert [(b.request_id, b.attempt, b.seq, b.events) for b in back] == [
        (b.request_id, b.attempt, b.seq, b.events) for b in batches
    ]
    for bad in (
        {"kind": "bundle"},
        {"kind": "bundle", "batches": [{"request_id": "a"}]},
        {"kind": "bundle", "batches": [3]},
    ):
        with pytest.raises(wire.WireError, match="malformed"):
            wire.decode_bundle(wire.dumps(bad))


def test_a_request_says_its_gateway_reads_bundles_and_an_older_one_does_not() -> None:
    body = wire.encode_request(_request())
    assert wire.reads_bundles(body)
    obj = json.loads(body)
    del obj["reply_bundles"]  # a v1 gateway from before bundles
    older = json.dumps(obj).encode()
    assert not wire.reads_bundles(older)
    assert wire.decode_request(older).request_id == "r1"


def test_heartbeat_limits_round_trip_and_are_optional() -> None:
    hb = Heartbeat("w1", "tiny", 4, 0, n_ctx_seq=1024, kv_cells=4096, chat_template="0123456789abcdef")
    assert decode_heartbeat(encode_heartbeat(hb)) == hb
    old = wire.dumps({"kind": "heartbeat", "id": "w0", "model": "tiny", "slots_total": 2, "slots_busy": 0})
    back = decode_heartbeat(old)  # a worker from before limits: unknown, never a guess
    assert (back.n_ctx_seq, back.kv_cells, back.chat_template) == (0, 0, "")


def test_a_refusal_event_keeps_its_parameter() -> None:
    ev = TokenEvent(
        "r4",
        finish_reason=FinishReason.ERROR,
        error="too long",
        error_param="max_tokens",
        error_counts=(900, 1024),
    )
    batch = wire.ReplyBatch("r4", 0, 0, [ev])
    (back,) = wire.decode_batch(wire.encode_batch(batch)).events
    assert back == ev
    plain = TokenEvent("r5", finish_reason=FinishReason.ERROR, error="engine failed")
    encoded = wire.encode_batch(wire.ReplyBatch("r5", 0, 0, [plain])).decode()
    assert "error_param" not in encoded and "error_retry_after" not in encoded


def test_a_not_now_refusal_keeps_its_retry_after_and_answers_503() -> None:
    """A worker whose model could not load in time says when to retry; the gateway's reply is serve's
    503 with Retry-After, not a 500. An older worker's refusal (no field) stays an engine error."""
    from outpost.api.pipeline.generation import Outcome, outcome_error

    ev = TokenEvent(
        "r6", finish_reason=FinishReason.ERROR, error="model 'a' is still loading", error_retry_after=5
    )
    (back,) = wire.decode_batch(wire.encode_batch(wire.ReplyBatch("r6", 0, 0, [ev]))).events
    assert back == ev
    out = Outcome("r6", 3)
    out.add(back)
    err = outcome_error(out, 60.0)
    assert err is not None and (err.status, err.headers) == (503, {"Retry-After": "5"})
    old = Outcome("r7", 3)
    old.add(TokenEvent("r7", finish_reason=FinishReason.ERROR, error="x"))
    assert (err2 := outcome_error(old, 60.0)) is not None and err2.status == 500


def test_cancel_round_trip_and_a_plain_one_reads_as_before() -> None:
    assert wire.decode_cancel(wire.encode_cancel("r4")) == wire.Cancel("r4", None)
    assert wire.decode_cancel(wire.encode_cancel("r4", before_attempt=3)) == wire.Cancel("r4", 3)
    assert "before_attempt" not in json.loads(wire.encode_cancel("r4"))  # v1 workers read it as plain
    with pytest.raises(wire.WireError, match="malformed cancel"):
        wire.decode_cancel(wire.dumps({"kind": "cancel", "request_id": "r", "before_attempt": "x"}))


def test_a_resubmitted_request_says_so_and_decodes_the_same() -> None:
    request = _request()
    again = wire.encode_request(request, resubmitted=True)
    assert wire.was_resubmitted(again) and not wire.was_resubmitted(wire.encode_request(request))
    back = wire.decode_request(again)
    assert (back.request_id, back.prompt_tokens, back.max_tokens, back.n_resumed) == (
        request.request_id,
        request.prompt_tokens,
        request.max_tokens,
        request.n_resumed,
    )


def test_a_resume_question_names_its_asker_and_reads_without_one() -> None:
    assert wire.decode_resume_query(wire.encode_resume_query("r1", "w-7")) == wire.ResumeQuery("r1", "w-7")
    assert wire.decode_resume_query(wire.encode_resume_query("r1")) == wire.ResumeQuery("r1", "")
    with pytest.raises(wire.WireError):
        wire.decode_resume_query(wire.dumps({"kind": "resume?", "request_id": 5}))


def test_a_request_lora_list_crosses_and_its_absence_means_the_defaults() -> None:
    """llama-server's per-request `lora` reaches the worker as given (it checks the ids); a request
    without one carries no field, and a worker reads that as its server-wide scales."""
    req = GenerateRequest(prompt_tokens=[1, 2], max_tokens=3, lora=((1, 0.5), (0, 2.0)))
    assert wire.decode_request(wire.encode_request(req)).lora == ((1, 0.5), (0, 2.0))
    plain = json.loads(wire.encode_request(GenerateRequest(prompt_tokens=[1], max_tokens=1)))
    assert "lora" not in plain
    assert wire.decode_request(json.dumps(plain).encode()).lora is None
    empty = GenerateRequest(prompt_tokens=[1], max_tokens=1, lora=())
    assert wire.decode_request(wire.encode_request(empty)).lora == ()
