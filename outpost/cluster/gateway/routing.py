"""The gateway's choice of queue for a request: a worker's lane (prefix affinity) or the shared queue.

Pure: no broker, no clock (callers pass `now`). Every gateway decides alone from the same inputs
(the workers' heartbeats: their slots, load and the block hashes of the prefixes they hold, see
prefix.py) plus what it published itself in the last seconds, so gateways need no shared routing
state and mostly agree:

- a prompt whose leading blocks (at least `match_min_tokens`) a live worker holds goes to that
  worker's lane (the longest match wins; among equals the one with the most free slots, then a
  rendezvous hash, which every gateway computes alike);
- a long prompt nobody holds yet is placed by rendezvous hashing on its leading blocks, so the
  next request with the same system prompt, from any gateway, lands on the same worker before
  its heartbeat says so; a worker busier than 1.25x the fair share, or whose KV cache has no
  room left for the prompt's blocks (its advertised size less what it holds), is passed over
  for the next in rendezvous order (bounded loads: hot prefixes spread, and prefixes fill the
  caches instead of evicting each other on one worker), and with no free slot anywhere the
  shared queue balances it (whoever pulls it will hold the prefix and advertise it);
- everything else goes to the shared queue, where workers pull as they have free slots.

A lane message expires after a spill window and is dead-lettered into the shared queue, so a busy
worker's affine requests go to the others after a bounded wait. The window is the prefill time the
match saves at the worker's advertised prefill speed (what waiting can win), within
[MIN_WINDOW_S, MAX_WINDOW_S] and at most a quarter of the time left before the request's deadline.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from outpost.cluster.prefix import BLOCK, block_hashes, matched_blocks

MATCH_MIN_TOKENS = 128  # a shorter shared prefix saves less prefill than a wait may cost
PLACE_MIN_TOKENS = 256  # a prompt this long is worth placing where its prefix will be again
PLACE_BLOCKS = 4  # placement hashes the first 256 tokens: a system prompt, not the user's turn
MAX_PROMPT_BLOCKS = 256  # blocks hashed per prompt (16k tokens)
MIN_WINDOW_S = 0.2
MAX_WINDOW_S = 10.0  # a 1,000-token prefix on one slow core is ~10 s of prefill saved
DEFAULT_PREFILL_TPS = 500.0  # a small model on a few CPU cores, until the worker says
MEMORY_S = 5.0  # how long this gateway remembers where it sent a prefix (heartbeats catch up)
LOAD_SLACK = 0.25  # a new prefix skips a worker busier than 1.25x the fair share


@dataclass(frozen=True)
class WorkerView:
    """What the gateway knows of a live worker, from its latest heartbeat."""

    worker_id: str
    model: str
    lane: str | None
    slots_total: int
    slots_busy: int
    draining: bool = False
    prefixes: frozenset[str] = frozenset()
    prefill_tps: float = 0.0
    cache_blocks: int = 0  # prefix blocks its KV cache can hold; 0: unknown (no room check)


@dataclass(frozen=True)
class Route:
    """Where to publish: `queue` is a lane (with `worker_id` and a spill window) or the shared queue."""

    queue: str
    worker_id: str | None = None
    window_s: float | None = None
    matched_tokens: int = 0
    reason: str = "shared"  # "prefix" | "placed" | "shared"


@dataclass
class _Sent:
    worker_id: str
    until: float


@dataclass
class Router:
    """One gateway's routing for one model's shared queue."""

    shared_queue: str
    enabled: bool = True
    memory: dict[str, _Sent] = field(default_factory=dict)  # block hash -> where this gateway sent it
    since_heartbeat: dict[str, int] = field(default_factory=dict)  # lane publishes not yet in a heartbeat

    def route(
        self,
        prompt: Sequence[int],
        workers: Sequence[WorkerView],
        now: float,
        time_left: float | None = None,
    ) -> tuple[Route, list[str]]:
        """The route for `prompt`, and the prompt's block hashes (for `published`)."""
        live = [w for w in workers if w.lane and not w.draining and w.slots_total > 0]
        if not self.enabled or not live or len(prompt) < min(MATCH_MIN_TOKENS, PLACE_MIN_TOKENS):
            return Route(self.shared_queue), []
        hashes = block_hashes(prompt, MAX_PROMPT_BLOCKS)
        matches = {w.worker_id: self._matched(w, hashes, now) for w in live}
        best = max(matches.values())
        if best * BLOCK >= MATCH_MIN_TOKENS:
            tied = [w for w in live if matches[w.worker_id] == best]
            home = max(tied, key=lambda w: (self._free(w), _score(hashes[best - 1], w.worker_id)))
            tps = home.prefill_tps or DEFAULT_PREFILL_TPS
            route = Route(home.lane or "", home.worker_id, best * BLOCK / tps, best * BLOCK, "prefix")
        elif len(hashes) * BLOCK >= PLACE_MIN_TOKENS:
            placed = self._place(hashes, live, now)
            if placed is None:
                return Route(self.shared_queue), hashes
            route = Route(placed.lane or "", placed.worker_id, MIN_WINDOW_S, 0, "placed")
        else:
            return Route(self.shared_queue), hashes
        window = min(max(route.window_s or 0.0, MIN_WINDOW_S), MAX_WINDOW_S)
        if time_left is not None:
            window = min(window, time_left / 4)
        if window < MIN_WINDOW_S:  # no time to wait for anyone in particular
            return Route(self.shared_queue), hashes
        return Route(route.queue, route.worker_id, window, route.matched_tokens, route.reason), hashes

    def published(self, route: Route, hashes: Sequence[str], now: float) -> None:
        """Remember a lane publish: the prefix will be there, and the worker has a slot less."""
        if route.worker_id is None:
            return
        self.since_heartbeat[route.worker_id] = self.since_heartbeat.get(route.worker_id, 0) + 1
        until = now + MEMORY_S
        for h in hashes:
            self.memory[h] = _Sent(route.worker_id, until)
        if len(self.memory) > 64 * MAX_PROMPT_BLOCKS:  # bounded: drop what has expired
            self.memory = {h: s for h, s in self.memory.items() if s.until > now}

    def heartbeat(self, worker_id: str) -> None:
        """A fresh heartbeat counts every earlier publish to that worker."""
        self.since_heartbeat.pop(worker_id, None)

    def _place(self, hashes: Sequence[str], live: Sequence[WorkerView], now: float) -> WorkerView | None:
        """The worker a new prefix goes to: the first in rendezvous order whose load is within
        (1 + LOAD_SLACK) x the fair share (consistent hashing with bounded loads, so a few hot
        prefixes do not all land on one worker) and whose KV cache has room for the prompt's
        blocks (so a worker is not handed a third system prompt while another holds one: it would
        evict one of its own and the two would take turns missing); with no room anywhere, the
        one with the most. None when no worker has a free slot."""
        key = hashes[min(len(hashes), PLACE_BLOCKS) - 1]
        ranked = sorted(live, key=lambda w: _score(key, w.worker_id), reverse=True)
        loads = {w.worker_id: w.slots_busy + self.since_heartbeat.get(w.worker_id, 0) for w in live}
        bound = math.ceil((sum(loads.values()) + 1) * (1 + LOAD_SLACK) / len(live))
        fair = [w for w in ranked if loads[w.worker_id] < bound and self._free(w) > 0]
        if not fair:
            return None
        room = self._room(fair, now)
        for worker in fair:
            if room[worker.worker_id] >= len(hashes):
                return worker
        return max(fair, key=lambda w: room[w.worker_id])

    def _room(self, workers: Sequence[WorkerView], now: float) -> dict[str, float]:
        """Blocks each worker's cache can take without evicting: its size less what it advertises
        and what this gateway sent it since (not yet in a heartbeat); inf where the size is unknown."""
        views = {w.worker_id: w for w in workers}
        room = {w.worker_id: float(w.cache_blocks - len(w.prefixes)) for w in workers}
        for h, sent in self.memory.items():  # one pass over what this gateway remembers
            view = views.get(sent.worker_id)
            if view is not None and sent.until >= now and h not in view.prefixes:
                room[sent.worker_id] -= 1
        return {wid: (math.inf if views[wid].cache_blocks <= 0 else r) for wid, r in room.items()}

    def _matched(self, worker: WorkerView, hashes: Sequence[str], now: float) -> int:
        advertised = matched_blocks(hashes, worker.prefixes)
        remembered = 0
        for h in hashes:
            sent = self.memory.get(h)
            if sent is None or sent.worker_id != worker.worker_id or sent.until < now:
                break
            remembered += 1
        return max(advertised, remembered)

    def _free(self, worker: WorkerView) -> int:
        return worker.slots_total - worker.slots_busy - self.since_heartbeat.get(worker.worker_id, 0)


def _score(key: str, worker_id: str) -> int:
    """Rendezvous (highest random weight) hashing: the same winner on every gateway."""
    return int.from_bytes(hashlib.blake2b(f"{key}/{worker_id}".encode(), digest_size=8).digest(), "big")
