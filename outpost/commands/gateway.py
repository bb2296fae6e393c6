"""`outpost gateway`'s composition root: the blocks it takes, handed to outpost/cluster/gateway/main.py."""

from __future__ import annotations

from outpost.cluster.gateway.main import serve_gateway
from outpost.commands.broker import connect_urls
from outpost.settings import BrokerSettings, GatewaySettings, HttpSettings, TracingSettings
from outpost.settings.fields import existing_file


def run_gateway(
    model_paths: list[str],
    broker: BrokerSettings,
    own: GatewaySettings,
    http: HttpSettings,
    tracing: TracingSettings,
) -> int:
    """Serve the API over the broker until stopped; returns the exit code."""
    for path in model_paths:
        existing_file(path)  # a missing file is a usage error, before anything connects
    return serve_gateway(http, own, tracing, connect_urls(broker), model_paths, broker.broker_quorum_size)
