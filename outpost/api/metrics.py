"""Prometheus metrics (prefix `outpost_`, and llama-server's `llamacpp:*`: llama/metrics.py) on a
registry of the app's own, and the request observer.

Token counters move as tokens are streamed, so an aborted request stops counting the moment it
stops. Gauges (slots busy, queue depth, KV cells used) are read from the scheduler at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST as PROMETHEUS_CONTENT_TYPE
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from outpost.api.llama.metrics import LlamaCppCollector, LlamaCppTotals
from outpost.backend import BackendStats
from outpost.messages import Timings, TokenEvent

__all__ = ["PROMETHEUS_CONTENT_TYPE", "Metrics", "RequestObserver"]

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """The metric families; one instance per app (tests build several apps in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = _LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, registry=r, buckets=buckets)

        self.ttft = histogram("outpost_time_to_first_token_seconds", "Arrival to first generated token")
        self.itl = histogram(
            "outpost_inter_token_latency_seconds", "Time between generated tokens", _ITL_BUCKETS
        )
        self.e2e = histogram("outpost_e2e_request_latency_seconds", "Arrival to last token")
        self.queue_time = histogram("outpost_queue_time_seconds", "Arrival to first scheduled step")
        self.requests = Counter(
            "outpost_requests", "HTTP requests by endpoint and status", ["endpoint", "status"], registry=r
        )
        self.prompt_tokens = Counter("outpost_prompt_tokens", "Prompt tokens received", registry=r)
        self.generation_tokens = Counter("outpost_generation_tokens", "Tokens generated", registry=r)
        self.prefix_reused = Counter(
            "outpost_prefix_cache_reused_tokens", "Prompt tokens served from the KV cache", registry=r
        )
        # llama-server's n_draft_total / n_draft_accepted (speculative decoding).
        self.draft_tokens = Counter(
            "outpost_draft_tokens", "Draft tokens verified (speculative decoding)", registry=r
        )
        self.draft_accepted = Counter(
            "outpost_draft_accepted_tokens",
            "Draft tokens the model accepted (speculative decoding)",
            registry=r,
        )
        self.slots_busy = Gauge("outpost_slots_busy", "Slots running a request", registry=r)
        self.queue_depth = Gauge("outpost_queue_depth", "Requests waiting for a slot", registry=r)
        self.kv_cells_used = Gauge("outpost_kv_cells_used", "KV cache cells in use", registry=r)
        self.llamacpp = LlamaCppTotals()

    def bind_stats(self, stats_of: Callable[[], BackendStats | None]) -> None:
        """Read the gauges from `stats_of()` (None while loading) whenever metrics are scraped."""

        def read(attr: str) -> Callable[[], float]:
            return lambda: float(getattr(stats_of() or BackendStats(), attr))

        self.slots_busy.set_function(read("slots_busy"))
        self.queue_depth.set_function(read("queue_depth"))
        self.kv_cells_used.set_function(read("kv_cells_used"))
        self.registry.register(LlamaCppCollector(self.llamacpp, stats_of))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class RequestObserver:
    """Feeds one generation's events into the metrics: TTFT, ITL, tokens, and at the end e2e/queue."""

    def __init__(self, metrics: Metrics, arrival: float, n_prompt: int) -> None:
        self._m = metrics
        self._arrival = arrival
        self._n_prompt = n_prompt
        self._last: float | None = None
        self.first_token_at: float | None = None

    def on_event(self, event: TokenEvent) -> None:
        n = len(event.token_ids)
        if n:
            now = time.monotonic()
            self._m.generation_tokens.inc(n)
            if self._last is None:
                self.first_token_at = now
                self._m.ttft.observe(now - self._arrival)
            else:
                gap = (now - self._last) / n
                for _ in range(n):
                    self._m.itl.observe(gap)
            self._last = now
        if event.finished:
            self._on_finish(event.timings)

    def _on_finish(self, timings: Timings | None) -> None:
        self._m.e2e.observe(time.monotonic() - self._arrival)
        self._m.prompt_tokens.inc(self._n_prompt)
        if timings is not None:
            self._m.queue_time.observe(timings.queue_ms / 1000.0)
            self._m.prefix_reused.inc(timings.cache_n)
            if timings.draft_n:
                self._m.draft_tokens.inc(timings.draft_n)
                self._m.draft_accepted.inc(timings.draft_n_accepted)
            self._m.llamacpp.add(timings)
