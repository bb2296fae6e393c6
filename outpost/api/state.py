"""The server's shared state: the engine (once loaded), its lifecycle status, in-flight count, embedder.

Routes reach it as `request.app.state.server`. The engine is loaded in a worker thread at
startup, so `status` moves `loading` -> `ok` (or `failed`), and to `draining` on SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Literal, Protocol

from outpost.api.config import ServerConfig
from outpost.api.errors import ApiError, not_ready
from outpost.api.metrics import Metrics

_log = logging.getLogger("outpost.api")

Status = Literal["loading", "ok", "draining", "failed"]


class EmbedderLike(Protocol):
    def embed(self, texts: list[str]) -> Any: ...

    def close(self) -> None: ...


class ServerState:
    """Everything routes share. Mutated only on the event loop, except `engine` set by the loader."""

    def __init__(self, config: ServerConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.model_id = config.served_model_id
        self.engine: Any = None  # outpost.runtime.Engine, or a stand-in with the same surface in tests
        self.status: Status = "loading"
        self.load_error: str | None = None
        self.inflight = 0  # requests being answered, health and metrics excluded
        self._embedder: EmbedderLike | None = None
        self._embedder_lock = asyncio.Lock()
        self._embed_lock = threading.Lock()

    def ready_engine(self) -> Any:
        """The engine, or a 503 while loading / draining."""
        if self.status != "ok" or self.engine is None:
            if self.status == "failed":
                raise ApiError(503, f"the model failed to load: {self.load_error}", code="load_failed")
            raise not_ready(self.status)
        return self.engine

    def begin_drain(self) -> None:
        if self.status != "draining":
            _log.warning("draining: refusing new requests, finishing %d in flight", self.inflight)
            self.status = "draining"

    async def load(self, factory: Callable[[], Any]) -> None:
        try:
            self.engine = await asyncio.to_thread(factory)
        except Exception as exc:
            self.status, self.load_error = "failed", " ".join(str(exc).split()) or type(exc).__name__
            _log.error("model failed to load: %s", self.load_error)
            return
        if self.status == "loading":
            self.status = "ok"

    async def embedder(self) -> EmbedderLike:
        """The embedding model, loaded on first use on its own llama context."""
        async with self._embedder_lock:
            embedder = self._embedder
            if embedder is None:
                if self.engine is not None:  # loading may run OpenMP kernels: engine thread only
                    job: Future[EmbedderLike] = self.engine.core.run_on_engine_thread(self._load_embedder)
                    embedder = await asyncio.wrap_future(job)
                else:
                    embedder = await asyncio.to_thread(self._load_embedder)
                self._embedder = embedder
            return embedder

    def _load_embedder(self) -> EmbedderLike:
        from outpost.engine.embedding import Embedder

        path = self.config.embedding_model or self.config.model_path
        threads = self.config.threads
        return Embedder(path, n_threads=threads if isinstance(threads, int) else None)

    async def embed(self, texts: list[str]) -> Any:
        embedder = await self.embedder()

        def run() -> Any:
            with self._embed_lock:
                return embedder.embed(texts)

        if self.engine is not None and self.engine.core.alive:
            # On the engine thread, between steps: a second thread driving llama.cpp's OpenMP
            # kernels would throttle their spin-waits and slow every decode down.
            return await asyncio.wrap_future(self.engine.core.run_on_engine_thread(run))
        return await asyncio.to_thread(run)

    def close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None
