"""`RemoteBackend`: the InferenceBackend a gateway serves, one per model, over its `GatewayLink`.

The API layer (outpost/api) sees only this: `submit` returns once the broker confirmed the
request (or raises QueueFull / BackendUnavailable before any byte of a reply goes out), the
stream yields the events the link forwards, and leaving it early cancels the request on the fleet.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from outpost.backend import BackendStats, PromptCodec
from outpost.cluster import wire_embed
from outpost.cluster.embed import vectors_of
from outpost.cluster.gateway.inflight import Pending
from outpost.cluster.gateway.link import GatewayLink
from outpost.messages import (
    EmbedInput,
    GenerateRequest,
    LoraAdapter,
    LoraScales,
    NotSupported,
    SlotAction,
    SlotActionError,
    SlotResult,
    TokenEvent,
)

UNKNOWN_POSITIONS = 1 << 20  # a model file that does not say its trained context: the workers decide


class RemoteStream:
    """The events of one request served by some worker; leaving early cancels it on the fleet."""

    def __init__(self, link: GatewayLink, pending: Pending) -> None:
        self.request_id = pending.request.request_id
        self._link = link
        self._pending = pending
        self._done = False

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        try:
            while not self._done:
                event = await self._pending.events.get()
                self._done = event.finished
                yield event
        finally:
            if not self._done:
                await self.aclose()

    async def aclose(self) -> None:
        if not self._done:
            self._done = True
            await self._link.cancel(self.request_id)


class RemoteBackend:
    """An InferenceBackend for one model served by the workers consuming its queue."""

    def __init__(
        self,
        link: GatewayLink,
        model: str,
        codec: PromptCodec,
        facts: dict[str, Any] | None = None,
        request_timeout: float = 600.0,
    ) -> None:
        """facts: the model's, from its vocab-only load (`n_ctx_train`: the limit until a worker says)."""
        self.link = link
        self.model = model
        self._codec = codec
        self._facts = dict(facts or {})
        self.request_timeout = request_timeout  # an embedding job's deadline, as a chat request's

    @property
    def codec(self) -> PromptCodec:
        return self._codec

    @property
    def n_ctx_seq(self) -> int:
        """The smallest positions per request among this model's live workers, as they report it,
        so a request none of them could hold is refused (400) before it is published. Until a
        worker is seen: the model's trained context (requests wait in the queue for a worker, and
        one smaller than that refuses an over-long request with the same 400 body)."""
        seen = self.link.n_ctx_seq(self.model)
        if seen is not None:
            return seen
        return int(self._facts.get("n_ctx_train") or UNKNOWN_POSITIONS)

    async def submit(self, request: GenerateRequest) -> RemoteStream:
        pending = await self.link.submit(self.model, request)
        return RemoteStream(self.link, pending)

    async def abort(self, request_id: str) -> None:
        await self.link.cancel(request_id)

    async def embed(self, texts: Sequence[EmbedInput]) -> tuple[list[list[float]], int]:
        """Vectors from a worker of this model; raises what `outpost serve`'s embed would."""
        strings = [t for t in texts if isinstance(t, str)]
        if len(strings) != len(texts):  # the wire's EmbedJob carries text (its version 1)
            raise ValueError("token-id inputs are not supported through a gateway: send text")
        job = wire_embed.EmbedJob(uuid.uuid4().hex, strings, deadline=time.monotonic() + self.request_timeout)
        return vectors_of(await self.link.embed(self.model, job))

    def stats(self) -> BackendStats:
        workers = self.link.live_workers()
        mine = [w for w in workers if w["model"] == self.model]
        return BackendStats(
            slots_total=sum(w["slots_total"] for w in mine),
            slots_busy=sum(w["slots_busy"] for w in mine),
            kv_cells_total=sum(w["kv_cells"] for w in mine),
            queue_depth=self.link.depths.get(self.model, 0),
            extra={
                "workers": workers,
                "queues": {m: self.link.depths.get(m, 0) for m in self.link.models},
                "broker": "connected" if self.link.connected else "unreachable",
                **self.link.counters,
            },
        )

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return []  # the workers' caches are theirs: the link routes by their heartbeats' hashes

    async def rerank(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]:
        raise NotSupported("reranking is not supported through the gateway: call a worker's serve")

    async def slot_action(self, action: SlotAction) -> SlotResult:
        # A slot lives in one worker's context; the gateway cannot name it.
        raise SlotActionError("slot actions are not supported through the gateway", "unsupported")

    def lora_adapters(self) -> list[LoraAdapter]:
        # Adapters are loaded by each worker; a request's `lora` list crosses to them (wire.py).
        raise NotSupported("/lora-adapters is not supported through the gateway: call a worker's serve")

    def set_lora_scales(self, scales: LoraScales) -> None:
        raise NotSupported("/lora-adapters is not supported through the gateway: call a worker's serve")

    def describe(self) -> dict[str, Any]:
        """The model's facts, and what the heartbeats say: how many live workers serve it
        (`workers`; 0: its requests wait in its queue for one) and hold it loaded (`workers_loaded`)."""
        workers, loaded = self.link.fleet.serving(self.model)
        return {**self._facts, "workers": workers, "workers_loaded": loaded}

    def close(self) -> None:
        pass  # the link is closed by whoever started it
