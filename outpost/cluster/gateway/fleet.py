"""A gateway's table of live workers, learnt from their heartbeats on the status exchange.

`WorkerTable` keeps the latest heartbeat of each worker of the gateway's own models (another
model's heartbeats are not this gateway's to route or show), by worker and model: a worker serving
several models sends a heartbeat for each (heartbeat.py), and each is a worker of that model here.
A worker not heard from for `topology.WORKER_TTL_S` is left out of routing at once and forgotten by
the next `live_workers`.
From it come routing's `WorkerView`s, `/health`'s `workers`, a model's positions per request
(`n_ctx_seq`: the smallest that any live, non-draining worker of it reports) and how many live
workers serve a model and hold it loaded (`/v1/models`' cards: `serving`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from outpost.cluster import wire
from outpost.cluster.broker import topology
from outpost.cluster.gateway.routing import WorkerView
from outpost.cluster.heartbeat import Heartbeat, decode_heartbeat

_log = logging.getLogger("outpost.cluster.gateway")


@dataclass
class WorkerSeen:
    heartbeat: Heartbeat
    view: WorkerView  # what routing reads (its prefixes as a set)
    last_seen: float  # time.time() of its last heartbeat
    seen_mono: float


class WorkerTable:
    """The live workers of a gateway's models, by (worker id, model)."""

    def __init__(self, models: Sequence[str]) -> None:
        self.models = models
        self.workers: dict[tuple[str, str], WorkerSeen] = {}

    def heard(self, body: bytes) -> Heartbeat | None:
        """Record a status message's heartbeat; None when it is unreadable or another model's."""
        try:
            hb = decode_heartbeat(body)
        except wire.WireError as exc:
            _log.warning("ignoring a status message: %s", exc)
            return None
        if hb.model not in self.models:  # another model's worker: not this gateway's to route or show
            return None
        view = WorkerView(
            hb.worker_id,
            hb.model,
            hb.lane,
            hb.slots_total,
            hb.slots_busy,
            hb.draining,
            frozenset(hb.prefixes),
            hb.prefill_tps,
            hb.cache_blocks,
        )
        self.workers[hb.worker_id, hb.model] = WorkerSeen(hb, view, time.time(), time.monotonic())
        return hb

    def views(self, model: str) -> list[WorkerView]:
        """What routing reads of the workers of `model` heard from within the TTL."""
        now = time.monotonic()
        return [
            s.view
            for s in self.workers.values()
            if s.view.model == model and now - s.seen_mono <= topology.WORKER_TTL_S
        ]

    def n_ctx_seq(self, model: str) -> int | None:
        """The positions per request every live, non-draining worker of `model` holds: the smallest
        they report. None until one that reports it is seen (older workers report 0)."""
        self.live_workers(model)  # forgets the expired ones
        limits = [
            s.heartbeat.n_ctx_seq
            for s in self.workers.values()
            if s.heartbeat.model == model and not s.heartbeat.draining and s.heartbeat.n_ctx_seq > 0
        ]
        return min(limits) if limits else None

    def serving(self, model: str) -> tuple[int, int]:
        """(live workers that serve `model`, those of them that hold it loaded now)."""
        self.live_workers(model)  # forgets the expired ones
        mine = [s.heartbeat for s in self.workers.values() if s.heartbeat.model == model]
        return len(mine), sum(hb.loaded for hb in mine)

    def live_workers(self, model: str | None = None) -> list[dict[str, Any]]:
        """Forgets the workers past the TTL; the rest as `/health` lists them."""
        now = time.monotonic()
        for wid in [w for w, s in self.workers.items() if now - s.seen_mono > topology.WORKER_TTL_S]:
            del self.workers[wid]
        return [
            {
                "id": s.heartbeat.worker_id,
                "model": s.heartbeat.model,
                "slots_total": s.heartbeat.slots_total,
                "slots_busy": s.heartbeat.slots_busy,
                "draining": s.heartbeat.draining,
                "requests_done": s.heartbeat.requests_done,
                "lane": s.heartbeat.lane,
                "prefix_blocks": len(s.heartbeat.prefixes),
                "prefill_tps": s.heartbeat.prefill_tps,
                "n_ctx_seq": s.heartbeat.n_ctx_seq,
                "kv_cells": s.heartbeat.kv_cells,
                "chat_template": s.heartbeat.chat_template,
                "models": list(s.heartbeat.served),
                "loaded": s.heartbeat.loaded,
                "last_seen": round(s.last_seen, 3),
            }
            for s in self.workers.values()
            if model is None or s.heartbeat.model == model
        ]
