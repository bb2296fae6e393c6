"""The wire format of embedding jobs and their replies: `embed` and `embedded` messages.

On wire.py's envelope (`{"v": WIRE_VERSION, "kind": ...}`, wall-clock deadlines, non-finite floats
as strings); a job goes to the model's request queue like a request, its reply to the gateway's
reply queue (embed.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from outpost.cluster import wire


class EmbedFailure(StrEnum):
    """Why an embedding job has no vectors; the gateway raises what `outpost serve` would."""

    INPUT = "input"  # a text longer than the embedding context: 400
    UNAVAILABLE = "unavailable"  # the worker's engine has stopped: 503
    ENGINE = "engine"  # the embedding failed: 500
    TIMEOUT = "timeout"  # the deadline passed before a worker took it: 504


@dataclass
class EmbedJob:
    """Texts to embed with the model's worker. Idempotent: a redelivery simply computes it again."""

    request_id: str
    texts: list[str]
    deadline: float | None = None  # time.monotonic() seconds; None: no deadline


@dataclass
class EmbedReply:
    """A worker's answer to an EmbedJob: one vector per text and the tokens read, or a failure."""

    request_id: str
    vectors: list[list[float]] = field(default_factory=list)
    n_tokens: int = 0
    failure: EmbedFailure | None = None
    error: str | None = None


def encode_embed_job(job: EmbedJob) -> bytes:
    deadline = None if job.deadline is None else wire.to_wall(job.deadline)
    return wire.dumps(
        {"kind": "embed", "request_id": job.request_id, "texts": job.texts, "deadline_unix": deadline}
    )


def decode_embed_job(body: bytes) -> EmbedJob:
    d = wire.loads(body, "embed")
    try:
        deadline = d.get("deadline_unix")
        texts = d["texts"]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise TypeError("texts must be a list of strings")
        deadline_mono = None if deadline is None else wire.to_monotonic(float(deadline))
        return EmbedJob(str(d["request_id"]), texts, deadline_mono)
    except (KeyError, TypeError, ValueError) as exc:
        raise wire.WireError(f"malformed embed message: {exc!r}") from exc


def encode_embed_reply(reply: EmbedReply) -> bytes:
    out: dict[str, Any] = {
        "kind": "embedded",
        "request_id": reply.request_id,
        "vectors": [[wire.float_out(x) for x in row] for row in reply.vectors],
        "n_tokens": reply.n_tokens,
    }
    if reply.failure is not None:
        out["failure"] = reply.failure.value
        out["error"] = reply.error or ""
    return wire.dumps(out)


def decode_embed_reply(body: bytes) -> EmbedReply:
    d = wire.loads(body, "embedded")
    try:
        failure = d.get("failure")
        return EmbedReply(
            str(d["request_id"]),
            [[wire.float_in(x) for x in row] for row in d["vectors"]],
            int(d["n_tokens"]),
            None if failure is None else EmbedFailure(failure),
            None if failure is None else str(d.get("error", "")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise wire.WireError(f"malformed embedded message: {exc!r}") from exc
