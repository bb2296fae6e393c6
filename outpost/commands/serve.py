"""`outpost serve`'s composition root: the API (outpost/api) over one local engine (outpost/serving)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

from outpost.api.app import create_app
from outpost.api.server import DrainingServer, configure_logging, uvicorn_config
from outpost.api.state import Backends
from outpost.commands.engine import engine_config, sized, start_engine
from outpost.serving.local_backend import LocalBackend
from outpost.serving.lora_defaults import LoraDefaults
from outpost.settings import EngineSettings, HttpSettings, ServeSettings, TracingSettings
from outpost.tracing import tracer_for

_log = logging.getLogger("outpost.api")


def build_local_backends(engine: EngineSettings, model_path: str, max_queue: int) -> Backends:
    """Load the model and start its engine thread (runs in a worker thread at startup)."""
    threads = engine.threads if isinstance(engine.threads, int) else 0
    running = start_engine(engine, model_path, max_queue)
    return {
        engine.served_model_id(model_path): LocalBackend(
            running,
            engine.embedding_model,
            threads,
            engine.slot_save_path,
            engine.reranker_path(model_path),
            LoraDefaults(engine.lora_adapters),
        )
    }


def serve(
    model_path: str,
    engine: EngineSettings,
    http: HttpSettings,
    own: ServeSettings,
    tracing: TracingSettings,
) -> int:
    """Serve until stopped; returns the process exit code."""
    engine_config(engine, model_path)  # a bad model file is a usage error, before anything starts
    engine, plan = sized(engine, model_path)
    configure_logging()
    for notice in engine.notices():
        _log.warning("%s", notice)
    embedding_ids = (Path(engine.embedding_model).stem,) if engine.embedding_model else ()
    app = create_app(
        partial(build_local_backends, engine, model_path, own.max_queue),
        http,
        engine.served_model_id(model_path),
        embedding_ids=embedding_ids,
        slots=plan.slots,
        tracer=tracer_for(tracing.otlp_endpoint, "outpost"),
    )
    uv_config, url = uvicorn_config(app, http)
    _log.info("loading %s; listening on %s", model_path, url)
    server = DrainingServer(uv_config, app.state.server, url, plan)
    server.run()
    return server.exit_code
