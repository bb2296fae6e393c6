"""The cluster's wire format: versioned JSON for requests, reply batches and control messages
(embedding jobs and replies: wire_embed.py, on the same envelope).

One encoder and one decoder per message kind, all carrying `{"v": WIRE_VERSION, "kind": ...}`; a
message of another version or kind is a `WireError`, never a guess. Two things do not cross as
they are in memory:

- times: `time.monotonic()` means nothing in another process, so deadlines and arrival times
  travel as wall-clock epoch seconds and come back on the receiver's monotonic clock;
- non-finite floats: JSON has no -inf, so logit-bias bans travel as a list of banned token ids,
  and other floats (logprobs of banned tokens) as the strings "-inf" / "inf" / "nan".

Everything is encoded with `allow_nan=False`, so a non-finite float that slipped through is an
error here rather than invalid JSON on the broker.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from outpost.messages import (
    FinishReason,
    GenerateRequest,
    LoraScales,
    SamplingParams,
    SpecRequest,
    Timings,
    TokenEvent,
    TokenLogprob,
)

WIRE_VERSION = 1
# Every kind of v1 message. New kinds and new optional fields are added within v1: a reader of an
# older v1 ignores the fields and answers an unknown kind with a WireError.
KINDS = ("request", "events", "bundle", "resume?", "resume", "cancel", "heartbeat", "embed", "embedded")


class WireError(ValueError):
    """A message this process cannot read: another wire version, another kind, or malformed."""


@dataclass
class ReplyBatch:
    """The events of one request gathered during one engine step (or a final error)."""

    request_id: str
    attempt: int
    seq: int  # per (request, attempt): 0, 1, 2, ...; the gateway forwards only the next one
    events: list[TokenEvent] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return any(e.finished for e in self.events)


@dataclass
class ResumeState:
    """The gateway's answer to a redelivered request's worker: what the client already has."""

    request_id: str
    attempt: int  # the new attempt; replies of older attempts are dropped from now on
    seq: int  # the first seq the new attempt sends
    token_ids: list[int] = field(default_factory=list)
    gone: bool = False  # the request has no client any more: drop it


# -- helpers ----------------------------------------------------------------------------------


def float_out(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)  # "-inf", "inf", "nan"


def float_in(x: Any) -> float:
    return float(x)  # float("-inf") parses the strings float_out writes


def dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps({"v": WIRE_VERSION, **obj}, allow_nan=False, separators=(",", ":")).encode()


def loads(body: bytes, kind: str | tuple[str, ...]) -> dict[str, Any]:
    """Parse a message, checking its version and kind."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"not a JSON message: {exc}") from exc
    if not isinstance(obj, dict):
        raise WireError("a wire message must be a JSON object")
    version = obj.get("v")
    if version != WIRE_VERSION:
        raise WireError(
            f"wire version {version!r} is not supported (this process speaks v{WIRE_VERSION}); "
            "run the same Outpost version on gateways and workers"
        )
    kinds = (kind,) if isinstance(kind, str) else kind
    if obj.get("kind") not in kinds:
        raise WireError(f"expected a {'/'.join(kinds)} message, got kind {obj.get('kind')!r}")
    return obj


# -- times ------------------------------------------------------------------------------------


def to_wall(monotonic_t: float, now_mono: float | None = None, now_wall: float | None = None) -> float:
    now_mono = time.monotonic() if now_mono is None else now_mono
    now_wall = time.time() if now_wall is None else now_wall
    return now_wall + (monotonic_t - now_mono)


def to_monotonic(wall_t: float, now_mono: float | None = None, now_wall: float | None = None) -> float:
    now_mono = time.monotonic() if now_mono is None else now_mono
    now_wall = time.time() if now_wall is None else now_wall
    return now_mono + (wall_t - now_wall)


# -- requests ---------------------------------------------------------------------------------


def _sampling_out(p: SamplingParams) -> dict[str, Any]:
    out: dict[str, Any] = {f.name: getattr(p, f.name) for f in fields(p)}
    out["logit_bias"] = [[t, b] for t, b in p.logit_bias if math.isfinite(b)]
    out["ban"] = [t for t, b in p.logit_bias if b == -math.inf]
    bad = [t for t, b in p.logit_bias if not math.isfinite(b) and b != -math.inf]
    if bad:
        raise WireError(f"logit bias for tokens {bad} is not a number or -inf")
    return out


def _sampling_in(d: dict[str, Any]) -> SamplingParams:
    known = {f.name for f in fields(SamplingParams)}
    kwargs = {k: v for k, v in d.items() if k in known and k != "logit_bias"}
    bias = [(int(t), float(b)) for t, b in d.get("logit_bias", [])]
    bias += [(int(t), -math.inf) for t in d.get("ban", [])]
    return SamplingParams(**kwargs, logit_bias=tuple(bias))


def _spec_out(spec: SpecRequest) -> dict[str, Any]:
    return {"type": spec.type, "n_max": spec.n_max, "n_min": spec.n_min}


def _spec_in(d: Any) -> SpecRequest | None:
    if d is None:
        return None

    def count(key: str) -> int | None:
        return None if d.get(key) is None else int(d[key])

    kind = d.get("type")
    return SpecRequest(None if kind is None else str(kind), count("n_max"), count("n_min"))


def _lora_in(d: Any) -> LoraScales | None:
    if d is None:
        return None
    return tuple((int(i), float(scale)) for i, scale in d)


def encode_request(req: GenerateRequest, resubmitted: bool = False) -> bytes:
    """`resubmitted`: sent again by its gateway after its own link was lost; some worker may have
    sent tokens of it, so the one that takes it asks `resume?` first, as for a redelivery."""
    return dumps(
        {
            "kind": "request",
            "request_id": req.request_id,
            "prompt_tokens": req.prompt_tokens,
            "max_tokens": req.max_tokens,
            "sampling": _sampling_out(req.sampling),
            "stop": list(req.stop),
            "deadline_unix": None if req.deadline is None else to_wall(req.deadline),
            "arrival_unix": to_wall(req.arrival_time),
            "n_resumed": req.n_resumed,
            # Absent when the request has none (v1 workers before speculative decoding ignore it).
            **({"speculative": _spec_out(req.speculative)} if req.speculative is not None else {}),
            # Absent for the server's default scales (earlier v1 workers ignore it: their defaults).
            **({"lora": [[i, scale] for i, scale in req.lora]} if req.lora is not None else {}),
            "reply_bundles": True,  # this gateway reads `bundle` replies (older workers ignore this)
            **({"resubmitted": True} if resubmitted else {}),
        }
    )


def decode_request(body: bytes | dict[str, Any]) -> GenerateRequest:
    d = body if isinstance(body, dict) else loads(body, "request")
    try:
        deadline = d.get("deadline_unix")
        return GenerateRequest(
            prompt_tokens=[int(t) for t in d["prompt_tokens"]],
            max_tokens=int(d["max_tokens"]),
            sampling=_sampling_in(d.get("sampling", {})),
            stop=tuple(d.get("stop", ())),
            request_id=str(d["request_id"]),
            deadline=None if deadline is None else to_monotonic(float(deadline)),
            arrival_time=to_monotonic(float(d["arrival_unix"])),
            n_resumed=int(d.get("n_resumed", 0)),  # absent in messages of earlier v1 senders
            speculative=_spec_in(d.get("speculative")),
            lora=_lora_in(d.get("lora")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"malformed request message: {exc!r}") from exc


def was_resubmitted(body: bytes | dict[str, Any]) -> bool:
    """Whether its gateway sent this request again after losing its link (see encode_request)."""
    d = body if isinstance(body, dict) else loads(body, "request")
    return d.get("resubmitted") is True


def as_resubmitted(fields: dict[str, Any]) -> bytes:
    """A request message's fields again, marked `resubmitted` (its taker asks `resume?` first)."""
    return dumps({k: v for k, v in fields.items() if k != "v"} | {"resubmitted": True})


def reads_bundles(body: bytes | dict[str, Any]) -> bool:
    """Whether the gateway that sent this request reads `bundle` replies (v1 gateways before them do not)."""
    d = body if isinstance(body, dict) else loads(body, "request")
    return d.get("reply_bundles") is True


# -- events -----------------------------------------------------------------------------------


def _logprob_out(lp: TokenLogprob) -> list[Any]:
    return [lp.token, float_out(lp.logprob), [[t, float_out(x)] for t, x in lp.top]]


def _logprob_in(x: Sequence[Any]) -> TokenLogprob:
    return TokenLogprob(int(x[0]), float_in(x[1]), tuple((int(t), float_in(v)) for t, v in x[2]))


def _event_out(e: TokenEvent) -> dict[str, Any]:
    out: dict[str, Any] = {"token_ids": e.token_ids, "text": e.text}
    if e.finish_reason is not None:
        out["finish_reason"] = e.finish_reason.value
    if e.timings is not None:
        t = e.timings
        out["timings"] = [t.prompt_n, t.prompt_ms, t.predicted_n, t.predicted_ms, t.cache_n, t.queue_ms]
        if t.draft_n:  # speculative decoding's counts; absent for older readers' sake otherwise
            out["timings"] += [t.draft_n, t.draft_n_accepted]
    if e.error is not None:
        out["error"] = e.error
    if e.error_param is not None:
        out["error_param"] = e.error_param
    if e.error_counts is not None:
        out["error_counts"] = list(e.error_counts)
    if e.error_retry_after is not None:
        out["error_retry_after"] = e.error_retry_after
    if e.logprobs is not None:
        out["logprobs"] = [_logprob_out(lp) for lp in e.logprobs]
    return out


def _event_in(request_id: str, d: dict[str, Any]) -> TokenEvent:
    timings = None
    if (t := d.get("timings")) is not None:
        timings = Timings(int(t[0]), float(t[1]), int(t[2]), float(t[3]), int(t[4]), float(t[5]))
        if len(t) >= 8:
            timings.draft_n, timings.draft_n_accepted = int(t[6]), int(t[7])
    finish = d.get("finish_reason")
    lps = d.get("logprobs")
    return TokenEvent(
        request_id,
        token_ids=[int(x) for x in d.get("token_ids", [])],
        text=str(d.get("text", "")),
        finish_reason=None if finish is None else FinishReason(finish),
        timings=timings,
        error=d.get("error"),
        logprobs=None if lps is None else [_logprob_in(x) for x in lps],
        error_param=None if d.get("error_param") is None else str(d["error_param"]),
        error_counts=_counts(d.get("error_counts")),
        error_retry_after=_seconds(d.get("error_retry_after")),
    )


def _seconds(value: Any) -> float | None:
    """A refusal's Retry-After; absent from older workers (their refusal is then a 500)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _counts(value: Any) -> tuple[int, int] | None:
    """A refusal's (prompt tokens, context size); absent from older workers."""
    if not isinstance(value, list) or len(value) != 2:
        return None
    return int(value[0]), int(value[1])


def _batch_out(batch: ReplyBatch) -> dict[str, Any]:
    return {
        "request_id": batch.request_id,
        "attempt": batch.attempt,
        "seq": batch.seq,
        "events": [_event_out(e) for e in batch.events],
    }


def _batch_in(d: dict[str, Any]) -> ReplyBatch:
    try:
        rid = str(d["request_id"])
        events = [_event_in(rid, e) for e in d["events"]]
        return ReplyBatch(rid, int(d["attempt"]), int(d["seq"]), events)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise WireError(f"malformed events message: {exc!r}") from exc


def encode_batch(batch: ReplyBatch) -> bytes:
    return dumps({"kind": "events", **_batch_out(batch)})


def decode_batch(body: bytes | dict[str, Any]) -> ReplyBatch:
    return _batch_in(body if isinstance(body, dict) else loads(body, "events"))


def encode_bundle(batches: Sequence[ReplyBatch]) -> bytes:
    """Several requests' batches for one gateway in one message (worker/outbox.py)."""
    return dumps({"kind": "bundle", "batches": [_batch_out(b) for b in batches]})


def decode_bundle(body: bytes | dict[str, Any]) -> list[ReplyBatch]:
    batches = (body if isinstance(body, dict) else loads(body, "bundle")).get("batches")
    if not isinstance(batches, list) or not all(isinstance(d, dict) for d in batches):
        raise WireError("malformed bundle message: not a list of batches")
    return [_batch_in(d) for d in batches]


# -- control ----------------------------------------------------------------------------------


@dataclass
class ResumeQuery:
    """A worker's `resume?`: `asker` names this one question (a copy asking again, because the
    answer is late or was lost, gets the same answer rather than a new attempt); empty from
    senders of earlier v1."""

    request_id: str
    asker: str = ""


def encode_resume_query(request_id: str, asker: str = "") -> bytes:
    return dumps({"kind": "resume?", "request_id": request_id, **({"asker": asker} if asker else {})})


def decode_resume_query(body: bytes) -> ResumeQuery:
    d = loads(body, "resume?")
    rid, asker = d.get("request_id"), d.get("asker", "")
    if not isinstance(rid, str) or not isinstance(asker, str):
        raise WireError("malformed resume? message: request_id and asker must be strings")
    return ResumeQuery(rid, asker)


def encode_resume(state: ResumeState) -> bytes:
    return dumps(
        {
            "kind": "resume",
            "request_id": state.request_id,
            "attempt": state.attempt,
            "seq": state.seq,
            "token_ids": state.token_ids,
            "gone": state.gone,
        }
    )


def decode_resume(body: bytes) -> ResumeState:
    d = loads(body, "resume")
    try:
        return ResumeState(
            str(d["request_id"]),
            int(d["attempt"]),
            int(d["seq"]),
            [int(t) for t in d["token_ids"]],
            bool(d.get("gone", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"malformed resume message: {exc!r}") from exc


@dataclass(frozen=True)
class Cancel:
    """Stop a request on every worker; with `before_attempt`, only its copies of an older attempt
    (a resume took it over: the copy still running elsewhere sends what nobody reads)."""

    request_id: str
    before_attempt: int | None = None


def encode_cancel(request_id: str, before_attempt: int | None = None) -> bytes:
    # Absent when it is a plain cancel: v1 workers before it read every cancel as plain.
    extra = {} if before_attempt is None else {"before_attempt": before_attempt}
    return dumps({"kind": "cancel", "request_id": request_id, **extra})


def decode_cancel(body: bytes) -> Cancel:
    d = loads(body, "cancel")
    try:
        before = d.get("before_attempt")
        return Cancel(str(d["request_id"]), None if before is None else int(before))
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"malformed cancel message: {exc!r}") from exc
