"""Running `outpost gateway`: outpost serve's app and drain over one RemoteBackend per model.

The gateway loads each model vocab-only (tokenize, render chat, count; the weights are never read)
and connects to the broker on the server's own event loop, so the backends and the broker link
share it. Its SIGTERM drain is `outpost serve`'s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from outpost.api.app import create_app
from outpost.api.server import DrainingServer, configure_logging, uvicorn_config
from outpost.cluster.broker import connection, topology
from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.metrics import ClusterCollector
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.settings import GatewaySettings, HttpSettings, TracingSettings
from outpost.tracing import Tracer

_log = logging.getLogger("outpost.api")

CONNECT_TIMEOUT_S = 60.0


def serve_gateway(
    config: HttpSettings,
    own: GatewaySettings,
    tracing: TracingSettings,
    url: str | list[str],
    models: dict[str, str],
    quorum_size: int | None = None,
) -> int:
    """Serve `models` (id -> GGUF path) until stopped; returns the process exit code."""
    configure_logging()
    return asyncio.run(_serve(config, own, tracing, url, models, quorum_size))


async def _serve(
    config: HttpSettings,
    own: GatewaySettings,
    tracing: TracingSettings,
    url: str | list[str],
    models: dict[str, str],
    quorum_size: int | None,
) -> int:
    loop = asyncio.get_running_loop()
    ids = list(models)
    link = GatewayLink(
        url, ids, prefix_routing=own.prefix_routing == "on", quorum_size=quorum_size, max_queue=own.max_queue
    )
    link.outage_bound_s = own.broker_outage
    opened: list[Any] = []
    template = own.template_text()

    def load() -> dict[str, RemoteBackend]:
        from outpost.engine.codec import load_codec

        backends: dict[str, RemoteBackend] = {}
        for mid, path in models.items():
            vocab_model = load_codec(path, template)
            opened.append(vocab_model)
            # Positions per request: what the live workers report (RemoteBackend.n_ctx_seq).
            facts = vocab_model.describe()
            backends[mid] = RemoteBackend(link, mid, vocab_model.codec, facts, config.request_timeout)
        asyncio.run_coroutine_threadsafe(link.start(CONNECT_TIMEOUT_S), loop).result()
        for url in link.urls:  # any node's management API sets a cluster-wide policy
            policy = topology.apply_length_policy(url, own.broker_management_url, ids, own.max_queue)
            if asyncio.run_coroutine_threadsafe(policy, loop).result():
                break
        return backends

    # The request's span is the gateway's; queue wait, prefill and decode come from the worker.
    endpoint = tracing.otlp_endpoint
    tracer = (
        Tracer(endpoint, "outpost-gateway", request_span="gateway receive", engine_phases=False)
        if endpoint
        else None
    )
    app = create_app(load, config, ids[0], tracer=tracer)
    app.state.server.metrics.registry.register(ClusterCollector(link))
    uv_config, where = uvicorn_config(app, config)
    _log.info(
        "gateway %s for %s via %s; listening on %s",
        link.gateway_id,
        ", ".join(ids),
        ", ".join(connection.redact(u) for u in link.urls),
        where,
    )
    server = DrainingServer(uv_config, app.state.server, where)
    try:
        await server.serve()
    finally:
        await link.close()
        for vocab_model in opened:
            vocab_model.close()
    return server.exit_code
