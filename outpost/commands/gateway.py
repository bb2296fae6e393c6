"""`outpost gateway`'s composition root: the blocks it takes and its models (-m and --models-dir),
handed to outpost/cluster/gateway/main.py."""

from __future__ import annotations

from pathlib import Path

from outpost.cluster.gateway.main import serve_gateway
from outpost.commands.broker import connect_urls
from outpost.commands.models import models_in_dir
from outpost.settings import BrokerSettings, GatewaySettings, HttpSettings, TracingSettings
from outpost.settings.fields import existing_file


def gateway_models(model_paths: list[str], models_dir: str | None) -> dict[str, str]:
    """id -> path: each -m by its file stem, then each GGUF of --models-dir by its name there (as
    serve and a worker name them); two models of one id are a usage error (ValueError)."""
    named = [(Path(p).stem, p) for p in model_paths]
    if models_dir:
        named += list(models_in_dir(models_dir).items())
    models = dict(named)
    if len(models) != len(named):
        ids = [name for name, _ in named]
        raise ValueError(f"two models have the same id: {sorted({i for i in ids if ids.count(i) > 1})}")
    for path in models.values():
        existing_file(path)  # a missing file is a usage error, before anything connects
    return models


def run_gateway(
    models: dict[str, str],
    broker: BrokerSettings,
    own: GatewaySettings,
    http: HttpSettings,
    tracing: TracingSettings,
) -> int:
    """Serve the API for `models` (id -> path) over the broker until stopped; returns the exit code."""
    return serve_gateway(http, own, tracing, connect_urls(broker), models, broker.broker_quorum_size)
