"""`outpost worker`'s composition root: the cluster's consumer (outpost/cluster) over one LocalBackend,
or over a model pool's models (`--models-dir`, the store: outpost/commands/models.py), as serve's."""

from __future__ import annotations

import asyncio

from outpost.cluster.worker.main import serve_worker
from outpost.cluster.worker.served import ServedModel
from outpost.commands.broker import connect_urls
from outpost.commands.engine import engine_config, sized, start_engine
from outpost.commands.models import LocalModelSource, build_pool
from outpost.serving.local_backend import LocalBackend
from outpost.serving.lora_defaults import LoraDefaults
from outpost.serving.model_pool import ModelSource
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


POOLED_ENGINE_QUEUE = 64  # never reached: the consumer holds at most a model's slots of its requests


def run_worker_models(
    models: dict[str, str],
    broker: BrokerSettings,
    engine: EngineSettings,
    own: WorkerSettings,
    tracing: TracingSettings,
) -> int:
    """Consume each model's requests (name -> path) until stopped, each model loaded by its first
    request and unloaded by the pool's rules (`--models-max`, memory, `--sleep-idle-seconds`)."""
    url = connect_urls(broker)
    for path in models.values():
        engine_config(engine, path)  # a bad model file is a usage error, before anything starts
    pool = build_pool(models, engine, own, POOLED_ENGINE_QUEUE)
    served = [ServedModel(name, m, _plan_slots(m.source)) for name, m in pool.models.items()]
    try:
        tracer = tracer_for(tracing.otlp_endpoint, "outpost-worker")
        quorum = broker.broker_quorum_size
        return asyncio.run(serve_worker(url, served, None, own.worker_id, tracer, quorum))
    finally:
        for m in pool.models.values():
            m.close()  # its engine if loaded, then its vocab-only load


def _plan_slots(source: ModelSource) -> int:
    """A pooled model's slots before it loads: its sizing plan's, as its engine will have them (1
    for a model that cannot fit here: its requests end with the pool's refusal)."""
    plan = source.plan if isinstance(source, LocalModelSource) else None
    return plan.slots if plan is not None else 1
