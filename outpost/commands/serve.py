"""`outpost serve`'s composition root: the API (outpost/api) over one local engine (outpost/serving),
or over a pool of models loaded on demand (outpost/commands/models.py)."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

from fastapi import FastAPI

from outpost.api.app import create_app
from outpost.api.server import DrainingServer, configure_logging, uvicorn_config
from outpost.api.state import Backends
from outpost.commands.engine import engine_config, sized, start_local_backend
from outpost.commands.models import build_pool
from outpost.settings import EngineSettings, HttpSettings, ServeSettings, TracingSettings
from outpost.sizing import Plan
from outpost.tracing import tracer_for

_log = logging.getLogger("outpost.api")


def build_local_backends(engine: EngineSettings, model_path: str, max_queue: int) -> Backends:
    """Load the model and start its engine thread (runs in a worker thread at startup)."""
    return {engine.served_model_id(model_path): start_local_backend(engine, model_path, max_queue)}


def build_pooled_backends(
    models: dict[str, str], engine: EngineSettings, own: ServeSettings, preload: tuple[str, ...] = ()
) -> Backends:
    """The model pool's models, none loaded but those in `preload` (runs in a worker thread)."""
    return build_pool(models, engine, own, own.max_queue, preload, own.models_autoload).models


def serve(
    model_path: str,
    engine: EngineSettings,
    http: HttpSettings,
    own: ServeSettings,
    tracing: TracingSettings,
) -> int:
    """Serve one model until stopped; returns the process exit code. With --sleep-idle-seconds it
    is a pool of one, loaded at start, unloaded when idle and reloaded by the next request."""
    engine_config(engine, model_path)  # a bad model file is a usage error, before anything starts
    engine, plan = sized(engine, model_path)
    configure_logging()
    for notice in engine.notices():
        _log.warning("%s", notice)
    model_id = engine.served_model_id(model_path)
    if own.sleep_idle_seconds >= 0:
        factory = partial(build_pooled_backends, {model_id: model_path}, engine, own, (model_id,))
    else:
        factory = partial(build_local_backends, engine, model_path, own.max_queue)
    embedding_ids = (Path(engine.embedding_model).stem,) if engine.embedding_model else ()
    app = create_app(
        factory,
        http,
        model_id,
        embedding_ids=embedding_ids,
        slots=plan.slots,
        tracer=tracer_for(tracing.otlp_endpoint, "outpost"),
    )
    return _run(app, http, f"loading {model_path}", plan)


def serve_models(
    models: dict[str, str],
    engine: EngineSettings,
    http: HttpSettings,
    own: ServeSettings,
    tracing: TracingSettings,
) -> int:
    """Serve several models (name -> path), each loaded by its first request (llama-server's router
    mode); returns the process exit code."""
    for path in models.values():
        engine_config(engine, path)  # a bad model file is a usage error, before anything starts
    configure_logging()
    for notice in engine.notices():
        _log.warning("%s", notice)
    app = create_app(
        partial(build_pooled_backends, models, engine, own),
        http,
        next(iter(models)),
        tracer=tracer_for(tracing.otlp_endpoint, "outpost"),
    )
    return _run(app, http, f"{len(models)} models ({', '.join(models)}), each loaded on demand", None)


def _run(app: FastAPI, http: HttpSettings, what: str, plan: Plan | None) -> int:
    uv_config, url = uvicorn_config(app, http)
    _log.info("%s; listening on %s", what, url)
    server = DrainingServer(uv_config, app.state.server, url, plan)
    server.run()
    return server.exit_code
