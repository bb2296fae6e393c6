"""The API/engine seam: what `outpost/api` needs from whatever generates tokens.

Two implementations satisfy `InferenceBackend`: `outpost.serving.local_backend.LocalBackend` (an
in-process engine thread: what `outpost serve` answers HTTP with and what a cluster worker answers
the broker with)
and the cluster gateway's remote backend (RabbitMQ -> workers). The API layer and the worker see
only this protocol, `PromptCodec` (tokenize / render / detokenize without the weights)
and the typed messages in `outpost.messages`.

Admission is explicit: `submit()` returns only once the request is accepted, and raises
`QueueFull` / `RequestRejected` / `BackendUnavailable` otherwise, so the HTTP layer can answer
429 / 400 / 503 before the first byte of a 200 goes out, even when accepting means awaiting a
broker's publisher confirm.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from outpost.messages import (
    BackendUnavailable,
    ChatTemplateError,
    EmbedInput,
    FimTokens,
    GenerateRequest,
    LoraAdapter,
    LoraScales,
    SlotAction,
    SlotResult,
    TokenEvent,
)

__all__ = [
    "BackendStats",
    "BackendUnavailable",
    "ChatTemplateError",
    "EventStream",
    "InferenceBackend",
    "ManagedBackend",
    "PromptCodec",
]


@runtime_checkable
class EventStream(Protocol):
    """The events of one accepted request, ending with the one whose `finish_reason` is set.

    Leaving the iteration early (or `aclose()`) aborts the request wherever it runs.
    """

    request_id: str

    def __aiter__(self) -> AsyncIterator[TokenEvent]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class BackendStats:
    """Load figures for /health, /slots, /metrics gauges and a worker's heartbeat, read when asked."""

    slots_total: int = 0
    slots_busy: int = 0
    queue_depth: int = 0
    kv_cells_used: int = 0
    kv_cells_total: int = 0
    n_decode: int = 0  # engine steps (llama_decode calls) so far; 0 where none run here (a gateway)
    n_busy_slots: int = 0  # busy slots summed over those steps
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. a gateway's workers and queues


class PromptCodec(Protocol):
    """What needs only a model's vocabulary and chat template (a vocab-only load, no weights)."""

    @property
    def n_vocab(self) -> int: ...

    @property
    def chat_template_source(self) -> str | None: ...

    @property
    def fim_tokens(self) -> FimTokens:
        """Fill-in-the-middle token ids (/infill); -1 for each the model lacks."""
        ...

    @property
    def bos_token(self) -> int:
        """The BOS id a prompt starts with, or -1 where the model adds none."""
        ...

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...

    def tokenize_prompt(self, text: str, add_special: bool = True) -> list[int]:
        """Like tokenize, adding BOS only where the model wants it and the text does not start with it."""
        ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def token_piece(self, token: int) -> bytes: ...

    def render_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        """The chat template applied to OpenAI-style message dicts; ChatTemplateError without one."""
        ...


class InferenceBackend(Protocol):
    """Generates tokens for `GenerateRequest`s: a local engine thread or a fleet behind a broker."""

    @property
    def codec(self) -> PromptCodec: ...

    @property
    def n_ctx_seq(self) -> int:
        """The most positions (prompt + output) one request may use."""
        ...

    async def submit(self, request: GenerateRequest) -> EventStream:
        """Accept the request or raise QueueFull / RequestRejected / BackendUnavailable."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def embed(self, texts: Sequence[EmbedInput]) -> tuple[list[list[float]], int]:
        """One L2-normalized vector per text or token-id list (the server's embedding model), and
        the tokens read; ValueError for an input it cannot take (too long, ids out of range)."""
        ...

    async def rerank(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]:
        """One relevance score per document, in order (the server's reranking model), and the
        tokens read; NotSupported without a reranker, ValueError for a pair too long."""
        ...

    def stats(self) -> BackendStats: ...

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """The token sequences its KV cache holds now (what a cluster worker advertises for
        prefix routing); empty where it holds none of its own (a gateway's)."""
        ...

    async def slot_action(self, action: SlotAction) -> SlotResult:
        """llama-server's slot save / restore / erase; SlotActionError when it cannot be done
        (slot files not enabled, not supported here, unknown or busy slot, a bad file)."""
        ...

    def lora_adapters(self) -> list[LoraAdapter]:
        """The LoRA adapters loaded, with their default scales (llama-server's GET /lora-adapters);
        NotSupported where they are not known here (a gateway's are its workers')."""
        ...

    def set_lora_scales(self, scales: LoraScales) -> None:
        """New default scales, ids not given at 0 (POST /lora-adapters); RequestRejected for an
        id not loaded, NotSupported where the adapters are not here."""
        ...

    def describe(self) -> dict[str, Any]:
        """Model facts for /v1/models' `meta` (arch, params, n_ctx_train, ...)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ManagedBackend(Protocol):
    """What a backend whose model loads on demand and unloads when idle adds (serve's model pool,
    outpost.serving.model_pool): llama-server's router routes and Ollama's keep_alive use it."""

    @property
    def status(self) -> str:
        """ "loaded", "loading" or "unloaded"."""
        ...

    @property
    def preload(self) -> bool:
        """Loaded when the server starts rather than by its first request."""
        ...

    @property
    def inflight(self) -> int: ...

    @property
    def error(self) -> str | None:
        """Why its last load failed, if it did."""
        ...

    def load(self) -> Awaitable[None]:
        """Start loading ("loading" from this call on); await it for the outcome."""
        ...

    async def unload(self) -> bool:
        """Unload now if idle; False when requests are in flight or it was not loaded."""
        ...

    def keep_for(self, seconds: float | None) -> None:
        """Stay loaded this long once idle (None: the server's rule; < 0: until unloaded)."""
        ...

    def expires_in(self) -> float | None:
        """Seconds until the idle model unloads; None: not loaded, busy, or kept."""
        ...
