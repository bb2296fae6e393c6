"""`LocalBackend`: an in-process engine thread behind the `outpost.backend.InferenceBackend` seam.

`outpost serve` answers HTTP with one and a cluster worker answers the broker with one. It adds to
`assembly.Engine` what the API needs and the engine thread should own: admission that raises before
a reply starts (a request its context cannot hold included), load figures, and an embedding model
loaded and run on the engine thread (llama.cpp's OpenMP kernels slow every decode down when a
second thread drives them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from outpost.backend import BackendStats, BackendUnavailable, EventStream
from outpost.engine.codec import LlamaCodec
from outpost.engine.config import EngineConfig
from outpost.messages import (
    EmbedInput,
    GenerateRequest,
    LoraAdapter,
    LoraScales,
    NotSupported,
    SlotAction,
    SlotResult,
    context_exceeded,
)
from outpost.serving.assembly import Engine
from outpost.serving.lora_defaults import LoraDefaults
from outpost.serving.slot_files import SlotFiles


def _weights(config: EngineConfig) -> str:
    """Where the weights are and, for the CPU's, their layout."""
    if config.n_gpu_layers < 0:
        return "every layer on the GPU"
    cpu = f"{config.weight_layout} weights"
    return f"{config.n_gpu_layers} layers on the GPU, {cpu} on the CPU" if config.n_gpu_layers else cpu


class Embedder(Protocol):
    def embed(self, texts: Sequence[EmbedInput]) -> Any: ...

    def close(self) -> None: ...


class Reranker(Protocol):
    def score(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]: ...

    def close(self) -> None: ...


class LocalBackend:
    """One loaded model on its engine thread; satisfies `InferenceBackend`."""

    def __init__(
        self,
        engine: Engine,
        embedding_model: str | None = None,
        threads: int = 0,
        slot_save_path: str | None = None,
        rerank_model: str | None = None,
        lora: LoraDefaults | None = None,
    ) -> None:
        """slot_save_path: the folder of llama-server's slot files (None: slot actions are off);
        rerank_model: the rank-pooling GGUF /rerank scores with (None: reranking is off);
        lora: the engine's adapters (its config's lora_adapters, in order) and their default scales."""
        self.engine = engine
        self._lora = lora or LoraDefaults()
        self._rerank_model = rerank_model
        self._reranker: Reranker | None = None
        self._slots = SlotFiles(engine, slot_save_path)
        self._embedding_model = embedding_model or engine.model.config.model_path
        self._threads = threads or engine.model.config.n_threads
        self._embedder: Embedder | None = None
        self._embedder_lock = asyncio.Lock()
        self._embed_lock = threading.Lock()

    @property
    def codec(self) -> LlamaCodec:
        return self.engine.codec

    @property
    def n_ctx_seq(self) -> int:
        return int(self.engine.n_ctx_seq)

    async def submit(self, request: GenerateRequest) -> EventStream:
        """Accepts a request only if this engine's context holds it whole: raises ContextExceeded
        (serve's API checked it already; a worker hears it here, with the same words)."""
        n_prompt = len(request.prompt_tokens) - request.n_resumed  # a resumed one's holds its sent tokens
        exceeded = context_exceeded(n_prompt, request.max_tokens, self.n_ctx_seq)
        if exceeded is not None:
            raise exceeded
        request.lora = self._lora.resolve(request.lora)  # the scheduler sees settings in normal form
        try:
            return self.engine.client.open(request)
        except RuntimeError as exc:  # the engine thread is stopping
            raise BackendUnavailable(f"the engine is not accepting requests: {exc}") from exc

    async def abort(self, request_id: str) -> None:
        self.engine.client.abort(request_id)

    def stats(self) -> BackendStats:
        scheduler = self.engine.core.scheduler
        return BackendStats(
            slots_total=self.engine.scheduler_config.n_slots,
            slots_busy=scheduler.slots_busy,
            queue_depth=scheduler.queue_depth,
            kv_cells_used=scheduler.kv_cells_used,
            kv_cells_total=self.engine.scheduler_config.n_ctx,
            n_decode=self.engine.core.decodes,
            n_busy_slots=self.engine.core.busy_slot_steps,
            extra={"prefill_budget": self.engine.prefill_budget.tokens},
        )

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return self.engine.core.cached_sequences()

    async def slot_action(self, action: SlotAction) -> SlotResult:
        return await self._slots.run(action)

    def lora_adapters(self) -> list[LoraAdapter]:
        return self._lora.listing()

    def set_lora_scales(self, scales: LoraScales) -> None:
        self._lora.set_scales(scales)

    def describe(self) -> dict[str, Any]:
        model = self.engine.model
        kv = "one KV pool" if model.kv_unified else "a KV stream per slot"
        serving = (
            f"{self.n_ctx_seq} positions per request, {_weights(model.config)}, {kv}, "
            f"{self.engine.prefill_budget.describe()}, {self.engine.core.follow_ups.describe()}"
        )
        if self.engine.spec_costs is not None:
            serving += f"; {self.engine.spec_costs.describe()}"
        if self.engine.kernels is not None:
            serving += f"; auto kernels: {self.engine.kernels.describe()}"
        serving += f"; {self.engine.runner.describe_sampling()}"
        facts = model.describe()
        return {**facts, "serving": f"{serving}; {facts['cpu_build']}"}

    async def embed(self, texts: Sequence[EmbedInput]) -> tuple[list[list[float]], int]:
        embedder = await self._load_embedder()

        def run() -> tuple[list[list[float]], int]:
            with self._embed_lock:
                vectors, n_tokens = embedder.embed(texts)
                return [list(map(float, row)) for row in vectors], int(n_tokens)

        if not self.engine.core.alive:
            raise BackendUnavailable("the engine has stopped")
        return await asyncio.wrap_future(self.engine.core.run_on_engine_thread(run))

    async def rerank(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]:
        reranker = await self._load_reranker()
        if not self.engine.core.alive:
            raise BackendUnavailable("the engine has stopped")
        job = self.engine.core.run_on_engine_thread(lambda: reranker.score(query, documents))
        return await asyncio.wrap_future(job)

    async def _load_reranker(self) -> Reranker:
        path, threads = self._rerank_model, self._threads
        if path is None:
            raise NotSupported("This server does not support reranking. Start it with `--reranking`")
        async with self._embedder_lock:
            if self._reranker is None:
                from outpost.engine.rerank import Reranker as LlamaReranker

                # Loaded and run on the engine thread, as the embedder (OpenMP: one driving thread).
                job = self.engine.core.run_on_engine_thread(lambda: LlamaReranker(path, threads))
                self._reranker = await asyncio.wrap_future(job)
            return self._reranker

    async def _load_embedder(self) -> Embedder:
        async with self._embedder_lock:
            if self._embedder is None:
                from outpost.engine.embedding import Embedder as LlamaEmbedder

                path, threads = self._embedding_model, self._threads

                def load() -> Embedder:
                    return LlamaEmbedder(path, n_threads=threads)

                # Loading may run OpenMP kernels: on the engine thread only.
                self._embedder = await asyncio.wrap_future(self.engine.core.run_on_engine_thread(load))
            return self._embedder

    def close(self) -> None:
        # The embedder's llama context is freed before the engine's thread and model go.
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._reranker is not None:
            self._reranker.close()
            self._reranker = None
        self.engine.close()
