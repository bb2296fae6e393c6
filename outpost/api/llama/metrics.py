"""llama-server's Prometheus series (`llamacpp:*`) beside Outpost's own, so its dashboards work.

Names, kinds and meanings are llama-server's (tools/server/server-task.cpp, `to_metrics`): token and
time counters summed from each finished request's timings, decode counts from the engine, and the
gauges read at scrape time from the backend's stats. Throughput gauges are averages over the
server's life (llama-server averages over a recent window; the totals above give any window).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from outpost.backend import BackendStats
from outpost.messages import Timings

PREFIX = "llamacpp:"


class LlamaCppTotals:
    """What finished requests add up to; `add` runs on the event loop, `collect` in a scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.prompt_n = 0
        self.cache_n = 0
        self.prompt_ms = 0.0
        self.predicted_n = 0
        self.predicted_ms = 0.0
        self.n_tokens_max = 0
        self.draft_n = 0
        self.draft_accepted = 0
        self.draft_steps = 0

    def add(self, t: Timings) -> None:
        with self._lock:
            self.prompt_n += t.prompt_n
            self.cache_n += t.cache_n
            self.prompt_ms += t.prompt_ms
            self.predicted_n += t.predicted_n
            self.predicted_ms += t.predicted_ms
            self.n_tokens_max = max(self.n_tokens_max, t.prompt_n + t.cache_n + t.predicted_n)
            self.draft_n += t.draft_n
            self.draft_accepted += t.draft_n_accepted
            self.draft_steps += t.draft_steps


def _rate(n: int, ms: float) -> float:
    return n / (ms / 1000.0) if ms > 0 else 0.0


class LlamaCppCollector(Collector):
    """The `llamacpp:*` families from `totals` and `stats_of()` (None while loading)."""

    def __init__(self, totals: LlamaCppTotals, stats_of: Callable[[], BackendStats | None]) -> None:
        self._totals = totals
        self._stats_of = stats_of

    def collect(self) -> Iterator[Metric]:
        t = self._totals
        s = self._stats_of() or BackendStats()
        counters = [
            ("prompt_tokens", "Number of prompt tokens processed, excluding cached tokens", t.prompt_n),
            ("prompt_tokens_cached", "Number of prompt tokens reused from the cache", t.cache_n),
            ("prompt_seconds", "Total time spent processing prompts", t.prompt_ms / 1000.0),
            ("tokens_predicted", "Number of generation tokens processed", t.predicted_n),
            ("tokens_predicted_seconds", "Total time spent generating tokens", t.predicted_ms / 1000.0),
            ("n_decode", "Total number of llama_decode() calls", s.n_decode),
            ("spec_decode_num_draft_tokens", "Speculative: Total draft tokens generated", t.draft_n),
            (
                "spec_decode_num_accepted_tokens",
                "Speculative: Total draft tokens accepted by the target model",
                t.draft_accepted,
            ),
            (
                "spec_decode_num_drafts",
                "Speculative: Total speculative decoding verification steps",
                t.draft_steps,
            ),
        ]
        for name, doc, value in counters:  # prometheus_client adds the _total suffix
            yield CounterMetricFamily(PREFIX + name, doc, value=value)
        ratio = s.kv_cells_used / s.kv_cells_total if s.kv_cells_total else 0.0
        gauges = [
            ("n_tokens_max", "Largest observed sequence length (prompt + generation)", t.n_tokens_max),
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s",
                _rate(t.prompt_n, t.prompt_ms),
            ),
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s",
                _rate(t.predicted_n, t.predicted_ms),
            ),
            ("requests_processing", "Number of requests processing", s.slots_busy),
            ("requests_deferred", "Number of requests deferred", s.queue_depth),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per llama_decode() call",
                s.n_busy_slots / max(s.n_decode, 1),
            ),
            ("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage", ratio),
            ("kv_cache_tokens", "KV-cache tokens", s.kv_cells_used),
        ]
        for name, doc, value in gauges:
            yield GaugeMetricFamily(PREFIX + name, doc, value=value)
