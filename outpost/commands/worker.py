"""`outpost worker`'s composition root: the cluster's consumer (outpost/cluster) over one LocalBackend."""

from __future__ import annotations

import asyncio

from outpost.cluster.worker.main import serve_worker
from outpost.commands.broker import connect_urls
from outpost.commands.engine import sized, start_engine
from outpost.serving.local_backend import LocalBackend
from outpost.serving.lora_defaults import LoraDefaults
from outpost.settings import BrokerSettings, EngineSettings, TracingSettings, WorkerSettings
from outpost.tracing import tracer_for


def run_worker(
    model_path: str,
    broker: BrokerSettings,
    engine: EngineSettings,
    own: WorkerSettings,
    tracing: TracingSettings,
) -> int:
    """Consume the model's requests from the broker until stopped; returns the exit code."""
    url = connect_urls(broker)
    engine, _ = sized(engine, model_path)
    assert isinstance(engine.parallel, int)  # sized
    # The engine's own queue never fills: the consumer holds at most `parallel` requests.
    # The same seam as serve's: embeddings on the engine thread, requests as EventStreams.
    running = start_engine(engine, model_path, engine.parallel)
    backend = LocalBackend(running, engine.embedding_model, lora=LoraDefaults(engine.lora_adapters))
    try:
        tracer = tracer_for(tracing.otlp_endpoint, "outpost-worker")
        model_id = engine.served_model_id(model_path)
        return asyncio.run(
            serve_worker(url, model_id, backend, own.worker_id, tracer, broker.broker_quorum_size)
        )
    finally:
        backend.close()  # the embedder, if one was loaded, then the engine
