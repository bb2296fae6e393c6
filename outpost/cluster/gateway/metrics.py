"""The gateway's cluster figures on /metrics: live workers, queue depths, resumes, dead letters.

A collector read at scrape time from the `GatewayLink`, registered on the app's own registry (the
request histograms, token counters and slot gauges are `outpost serve`'s, from outpost/api).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from outpost.cluster.gateway.link import GatewayLink


class ClusterCollector(Collector):
    def __init__(self, link: GatewayLink) -> None:
        self.link = link

    def collect(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily("outpost_cluster_workers", "Live workers by model", labels=["model"])
        slots = GaugeMetricFamily("outpost_cluster_slots", "Slots of live workers by model", labels=["model"])
        depth = GaugeMetricFamily(
            "outpost_cluster_queue_depth", "Requests waiting in the broker by model", labels=["model"]
        )
        live = self.link.live_workers()
        for model in self.link.models:
            mine = [w for w in live if w["model"] == model]
            workers.add_metric([model], len(mine))
            slots.add_metric([model], sum(w["slots_total"] for w in mine))
            depth.add_metric([model], self.link.depths.get(model, 0))
        yield from (workers, slots, depth)
        up = GaugeMetricFamily("outpost_cluster_broker_connected", "1 while the broker connection is up")
        up.add_metric([], 1.0 if self.link.connected else 0.0)
        yield up
        docs = {
            "resumes": "Requests continued from what their client has (a worker died, or a lost link)",
            "resubmitted": "Requests sent again because the broker lost them (handed back, or replies lost)",
            "duplicates": "Reply batches dropped as late or repeated",
            "dead_lettered": "Requests the broker gave up on (expired in the queue, or poison)",
            "routed_prefix": "Requests sent to the lane of the worker holding their prompt's prefix",
            "routed_placed": "Requests with a new long prefix sent to the lane of the worker it hashes to",
            "routed_shared": "Requests sent to the model's shared queue",
            "lane_full": "Lane publishes refused (the worker's lane was full): sent to the shared queue",
        }
        for name, doc in docs.items():
            counter = CounterMetricFamily(f"outpost_cluster_{name}", doc)
            counter.add_metric([], self.link.counters.get(name, 0))
            yield counter
