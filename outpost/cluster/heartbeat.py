"""A worker's heartbeat on the status exchange: its load, its lane, and the prefixes its KV holds.

Encoded like every cluster message (outpost/cluster/wire.py: versioned JSON, one encoder and one
decoder). Gateways keep the latest heartbeat of each worker: /health lists them, and routing
(gateway/routing.py) reads the slots, the lane, the advertised prefix hashes (prefix.py) and the measured
prefill speed; the API's admission reads the real limits (positions per request, KV cells) and the
chat template's hash. Fields added after the first version are optional when decoding.

A worker serving several models (`outpost worker --models-dir`) publishes one heartbeat per model,
each with that model's slots, lane, prefixes and limits, and two fields added within v1: `models`,
every model the worker serves, and `loaded`, whether this one is loaded now (a pooled model loads on
its first request). An older worker's heartbeat reads as serving its one model, loaded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from outpost.cluster.wire import WireError, dumps, loads


@dataclass(frozen=True)
class Heartbeat:
    """A worker's state, published about once a second."""

    worker_id: str
    model: str
    slots_total: int
    slots_busy: int
    draining: bool = False
    requests_done: int = 0  # requests this worker finished (acked) since it started
    lane: str | None = None  # its own queue for requests routed to it by prefix
    prefixes: tuple[str, ...] = ()  # block hashes of what its slots hold (prefix.py)
    prefill_tps: float = 0.0  # prompt tokens per second it evaluates (recent requests)
    cache_blocks: int = 0  # prefix blocks its KV cache can hold (cells / BLOCK); 0: unknown
    # Its real limits, so a gateway answers as the smallest worker would (0 / "": an older worker).
    n_ctx_seq: int = 0  # positions (prompt + output) one request may use
    kv_cells: int = 0  # its KV cache's cells, all slots together
    chat_template: str = ""  # a hash of the chat template its model carries ("" for none)
    models: tuple[str, ...] = ()  # every model the worker serves (); () from an older worker: `model`
    loaded: bool = True  # whether `model` is loaded now (False: its first request loads it)

    @property
    def served(self) -> tuple[str, ...]:
        """Every model the worker serves (an older worker's heartbeat: its one model)."""
        return self.models or (self.model,)


def encode_heartbeat(hb: Heartbeat) -> bytes:
    return dumps(
        {
            "kind": "heartbeat",
            "id": hb.worker_id,
            "model": hb.model,
            "slots_total": hb.slots_total,
            "slots_busy": hb.slots_busy,
            "draining": hb.draining,
            "requests_done": hb.requests_done,
            "lane": hb.lane,
            "prefixes": list(hb.prefixes),
            "prefill_tps": round(hb.prefill_tps, 1),
            "cache_blocks": hb.cache_blocks,
            "n_ctx_seq": hb.n_ctx_seq,
            "kv_cells": hb.kv_cells,
            "chat_template": hb.chat_template,
            "models": list(hb.models),
            "loaded": hb.loaded,
        }
    )


def decode_heartbeat(body: bytes) -> Heartbeat:
    d = loads(body, "heartbeat")
    try:
        lane = d.get("lane")
        prefixes = d.get("prefixes") or []
        models = d.get("models") or []
        if not isinstance(prefixes, list) or not isinstance(models, list):
            raise TypeError("prefixes and models must be lists")
        return Heartbeat(
            str(d["id"]),
            str(d["model"]),
            int(d["slots_total"]),
            int(d["slots_busy"]),
            bool(d.get("draining", False)),
            int(d.get("requests_done", 0)),
            None if lane is None else str(lane),
            tuple(str(h) for h in prefixes),
            float(d.get("prefill_tps", 0.0)),
            int(d.get("cache_blocks", 0)),
            int(d.get("n_ctx_seq", 0)),
            int(d.get("kv_cells", 0)),
            str(d.get("chat_template", "")),
            tuple(str(m) for m in models),
            bool(d.get("loaded", True)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WireError(f"malformed heartbeat: {exc!r}") from exc


def template_hash(source: str | None) -> str:
    """A short, stable name of a chat template's text ("" when the model has none)."""
    return hashlib.sha256(source.encode()).hexdigest()[:16] if source else ""
