"""The FastAPI application: routers, error handlers, middleware, and the engine's lifecycle.

`create_app(backends_or_factory, config)` wires it all. Given a factory, the lifespan loads the
backends (`outpost.backend.InferenceBackend`s) in a worker thread after the server starts
listening, so /health answers `loading` (503)
and then `ok`; the app closes what it loaded on shutdown. Middleware, outermost first: request
log/metrics/drain gate -> CORS (llama-server's default: any origin; `--cors-origins none`: off) ->
API keys -> body limit.
The browser chat page (webui/) is at `/` unless `--no-webui`; its files need no key.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

import outpost
from outpost.api import webui
from outpost.api.anthropic import routes as anthropic_routes
from outpost.api.auth import ApiKeyMiddleware
from outpost.api.errors import Envelopes, install_error_handlers
from outpost.api.limits import BodyLimitMiddleware
from outpost.api.llama import completion, infill, props, rerank
from outpost.api.llama import embeddings as native_embeddings
from outpost.api.llama import lora as lora_routes
from outpost.api.llama import router as model_router
from outpost.api.llama import routes as llama_routes
from outpost.api.llama import slots as slot_routes
from outpost.api.metrics import Metrics
from outpost.api.ollama import routes as ollama_routes
from outpost.api.ollama.translate import error_response as ollama_error
from outpost.api.openai import embeddings
from outpost.api.openai import routes as openai_routes
from outpost.api.requestlog import RequestLogMiddleware
from outpost.api.responses import routes as responses_routes
from outpost.api.responses.store import ResponseStore
from outpost.api.sagemaker import routes as sagemaker
from outpost.api.state import BackendFactory, Backends, ServerState
from outpost.settings import HttpSettings
from outpost.tracing import Tracer

# llama-server's `--cors-origins localhost`: an origin whose host is the local machine, any scheme
# and port (a dev server on :5173 as well as the chat page itself).
LOCALHOST_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"


def cors_options(origins: tuple[str, ...]) -> dict[str, Any] | None:
    """CORSMiddleware's origin options for --cors-origins (None: CORS off). `*` answers any origin
    (with credentials, Starlette echoes it, as llama-server does); other entries match exactly."""
    if not origins or "none" in origins:
        return None
    exact = [o for o in origins if o != "localhost"]
    regex = LOCALHOST_ORIGINS if "localhost" in origins else None
    return {"allow_origins": exact, "allow_origin_regex": regex}


class LlamaCors(CORSMiddleware):
    """Starlette's CORS, but a preflight from an origin not allowed gets llama-server's answer: 200
    with no allow headers (the browser refuses the call), not a 400."""

    def preflight_response(self, request_headers: Headers) -> Response:
        if self.is_allowed_origin(origin=request_headers["origin"]):
            return super().preflight_response(request_headers)
        return PlainTextResponse("OK", status_code=200, headers={"Vary": "Origin"})


def _lifespan(state: ServerState, factory: BackendFactory | None) -> Any:
    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.ensure_future(state.load(factory)) if factory is not None else None
        try:
            yield
        finally:
            if loader is not None:
                await loader  # a load in progress cannot be interrupted: wait, then free it
                await asyncio.to_thread(state.close)

    return lifespan


def create_app(
    backends: Backends | BackendFactory,
    config: HttpSettings,
    model_id: str,
    *,
    embedding_ids: tuple[str, ...] = (),
    slots: int | None = None,
    tracer: Tracer | None = None,
) -> FastAPI:
    """An app serving `backends` (model id -> InferenceBackend; `model_id` the default), or what
    `backends()` loads. Spans go to `tracer` (None: no tracing); see ServerState for the rest."""
    metrics = Metrics()
    state = ServerState(config, metrics, model_id, embedding_ids, slots)
    factory: BackendFactory | None = backends if callable(backends) else None
    if factory is None:
        assert not callable(backends)
        state.install(backends)
    metrics.bind_stats(state.stats)
    app = FastAPI(
        title="Outpost",
        version=getattr(outpost, "__version__", "0"),
        description="OpenAI-compatible and SageMaker API for small language models on llama.cpp",
        lifespan=_lifespan(state, factory),
    )
    app.state.server = state
    app.state.responses = ResponseStore(config.responses_max, config.responses_ttl)
    # Every API's routes, each from its own module, registered (and so matched) in this order.
    apis = [openai_routes, responses_routes, anthropic_routes, completion, infill, props, slot_routes]
    apis += [lora_routes, rerank, embeddings, native_embeddings, llama_routes, model_router, sagemaker]
    routers = [m.router for m in (*apis, ollama_routes)]
    if config.webui:
        routers.append(webui.build_router())
    for router in routers:
        app.include_router(router)
    install_error_handlers(app)
    known = frozenset(r.path for router in routers for r in router.routes if isinstance(r, Route))
    # Errors given before a route runs, in the envelope of the API the path belongs to.
    envelopes = Envelopes({"/v1/messages": anthropic_routes.error_response, "/api/": ollama_error})
    app.add_middleware(BodyLimitMiddleware, max_body=config.max_body, envelopes=envelopes)
    open_paths = (*config.open_paths, *webui.OPEN_PATHS) if config.webui else config.open_paths
    app.add_middleware(ApiKeyMiddleware, keys=config.api_keys, open_paths=open_paths, envelopes=envelopes)
    if (cors := cors_options(config.cors_origins)) is not None:
        app.add_middleware(
            LlamaCors,
            **cors,
            allow_credentials=True,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
        )
    app.add_middleware(
        RequestLogMiddleware, state=state, known_paths=known, tracer=tracer, envelopes=envelopes
    )
    return app
