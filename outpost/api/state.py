"""The server's shared state: the backends (once loaded) by model id, lifecycle status, in-flight count.

Routes reach it as `request.app.state.server`. Backends are `outpost.backend.InferenceBackend`s:
one local engine for `outpost serve`, one remote backend per model for a gateway. They load in a
worker thread at startup, so `status` moves `loading` -> `ok` (or `failed`), and to `draining`
on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal

from starlette.requests import Request

from outpost.api.errors import ApiError, not_ready
from outpost.api.metrics import Metrics
from outpost.api.pipeline.mapping import server_defaults
from outpost.backend import BackendStats, InferenceBackend, ManagedBackend
from outpost.settings import HttpSettings

_log = logging.getLogger("outpost.api")

Status = Literal["loading", "ok", "draining", "failed"]
Backends = Mapping[str, InferenceBackend]  # model id -> backend; the first is the default
BackendFactory = Callable[[], Backends]


class ServerState:
    """Everything routes share. Mutated only on the event loop, except `backends` set by the loader."""

    def __init__(
        self,
        config: HttpSettings,
        metrics: Metrics,
        model_id: str,
        embedding_ids: tuple[str, ...] = (),
        slots: int | None = None,
    ) -> None:
        """model_id: the default model's id (known before it loads); embedding_ids: extra ids
        /v1/embeddings answers to (serve's --embedding-model); slots: /health's figure while loading."""
        self.config = config
        self.sampling_defaults = server_defaults(config.temp, config.seed)
        self.metrics = metrics
        self.model_id = model_id
        self.embedding_ids = embedding_ids
        self.slots = slots
        self.backends: dict[str, InferenceBackend] = {}
        self.status: Status = "loading"
        self.load_error: str | None = None
        self.inflight = 0  # requests being answered, health and metrics excluded
        self.background: set[asyncio.Future[Any]] = set()  # work a reply started and does not wait for

    @property
    def model_ids(self) -> list[str]:
        return list(self.backends) or [self.model_id]

    def backend_for(self, requested: str | None) -> tuple[str, InferenceBackend]:
        """The (model id, backend) a request names (None: the default), or a 503; a name that is
        not served is a 404 only where several models are (a gateway), else the one served."""
        if self.status != "ok" or not self.backends:
            if self.status == "failed":
                raise ApiError(503, f"the model failed to load: {self.load_error}", code="load_failed")
            raise not_ready(self.status)
        if not requested or len(self.backends) == 1:
            # One model served: any name is it (llama-server's rule; clients send gpt-4o-mini).
            return next(iter(self.backends.items()))
        backend = self.backends.get(requested)
        if backend is None:
            served = ", ".join(repr(m) for m in self.backends)
            raise ApiError(
                404,
                f"the model {requested!r} does not exist here; this server serves {served} (see /v1/models)",
                param="model",
                code="model_not_found",
            )
        return requested, backend

    def ready_backend(self) -> InferenceBackend:
        """The default backend, or a 503 while loading / draining."""
        return self.backend_for(None)[1]

    def stats(self) -> BackendStats | None:
        """The default backend's load figures, None while loading."""
        backend = next(iter(self.backends.values()), None)
        return backend.stats() if backend is not None else None

    def begin_drain(self) -> None:
        if self.status != "draining":
            _log.warning("draining: refusing new requests, finishing %d in flight", self.inflight)
            self.status = "draining"

    def install(self, backends: Backends) -> None:
        self.backends = dict(backends)
        if self.status == "loading":
            self.status = "ok"

    async def load(self, factory: BackendFactory) -> None:
        try:
            backends = await asyncio.to_thread(factory)
            # Models loaded on demand but wanted at start (one -m that sleeps when idle): load them now.
            for backend in backends.values():
                if isinstance(backend, ManagedBackend) and backend.preload:
                    await backend.load()
        except Exception as exc:
            self.status, self.load_error = "failed", " ".join(str(exc).split()) or type(exc).__name__
            _log.error("model failed to load: %s", self.load_error)
            return
        self.install(backends)

    def close(self) -> None:
        backends, self.backends = self.backends, {}
        for backend in backends.values():
            backend.close()


def state_of(request: Request) -> ServerState:
    """The app's `ServerState`, as a route reaches it."""
    state = request.app.state.server
    assert isinstance(state, ServerState)
    return state
