"""The engine a cluster worker drives: `LocalEngine` (what the worker needs) and `RuntimeEngine`.

The worker talks to its engine through this protocol only, so tests run workers on fake engines
(tests/integration/cluster_fake_engine.py) and the real one is `outpost.runtime.Engine`, whose
engine thread calls the sink once per step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from outpost.messages import GenerateRequest, TokenEvent


class LocalEngine(Protocol):
    """What the worker needs from an engine: the slot count, a thread-safe submit/abort, embeddings."""

    @property
    def slots_total(self) -> int: ...

    def submit(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None: ...

    def abort(self, request_id: str) -> None: ...

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """As `LocalBackend.embed`: vectors and tokens read; ValueError for a text too long."""
        ...

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """The token sequences the slots' KV cache holds (what the worker advertises)."""
        ...

    @property
    def kv_cells(self) -> int:
        """The KV cache's size in token cells, all slots together (what placement fills)."""
        ...


class RuntimeEngine:
    """`outpost.runtime.Engine` seen as a LocalEngine (its core's submit calls the sink per step).

    Embeddings are `LocalBackend`'s, as on `outpost serve`: the served model's file, loaded on first
    use and run on the engine thread. `close()` frees the embedder, then the engine."""

    def __init__(self, engine: Any, embedding_model: str | None = None) -> None:
        """embedding_model: the GGUF embedding jobs run on (`--embedding-model`; None: the served one)."""
        from outpost.local import LocalBackend  # llama.cpp: only where a real engine runs

        self.engine = engine
        self._local = LocalBackend(engine, embedding_model)

    @property
    def slots_total(self) -> int:
        return int(self.engine.scheduler_config.n_slots)

    @property
    def kv_cells(self) -> int:
        return int(self.engine.scheduler_config.n_ctx)

    def submit(self, request: GenerateRequest, sink: Callable[[TokenEvent], None]) -> None:
        self.engine.core.submit(request, sink)

    def abort(self, request_id: str) -> None:
        self.engine.core.abort(request_id)

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        return await self._local.embed(texts)

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return self.engine.core.cached_sequences()  # type: ignore[no-any-return]

    def close(self) -> None:
        self._local.close()
