"""Many models behind one server: loaded on demand, the least recently used idle one unloaded to make
room, idle ones put to sleep (llama-server's router mode and `--sleep-idle-seconds`, Ollama's
`keep_alive`).

`ModelPool` decides; each of its `PooledModel`s is one model's `InferenceBackend`, which routes use as
any other. What the pipeline needs before a request is submitted (the codec, positions per request) is
known without the weights (a vocab-only load and the sizing plan: `ModelSource`), so a model loads
only when a request reaches `submit` (or `embed`, `rerank`, a slot action). The pool runs on the event
loop and does no llama.cpp work itself: a source's `load()` and a backend's `close()` run in a worker
thread. An idle model's expiry is a timer on the loop (`call_later`), re-armed at each release.

The rules: a model with requests in flight (or waiting for its load) is never unloaded; loads happen
one at a time; room is made by unloading idle models, least recently used first, until the count
(`models_max`) and the memory budget hold, waiting (bounded) for a busy one to go idle; a model whose
need alone exceeds the budget is refused with what it needs; a request waits at most `load_wait_s` for
its model, then gets a 503 with Retry-After while the load goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from outpost.backend import BackendStats, EventStream, InferenceBackend, PromptCodec
from outpost.messages import (
    BackendUnavailable,
    LoraAdapter,
    LoraScales,
    NotSupported,
    RequestRejected,
    TokenEvent,
)

_log = logging.getLogger("outpost.api")

Status = Literal["unloaded", "loading", "loaded"]


@dataclass(frozen=True)
class PoolLimits:
    """What the pool may hold and how long it waits."""

    models_max: int = 4  # loaded at once (llama-server's --models-max); 0: no limit on the count
    memory_bytes: int = 0  # what loaded models may need together; 0: no budget
    autoload: bool = True  # a request for an unloaded model loads it (else a 400)
    load_wait_s: float = 300.0  # a request waits this long for its model's load, then a 503
    idle_unload_s: float | None = None  # --sleep-idle-seconds: unload after this long idle; None: never


class ModelSource(Protocol):
    """One model as the pool knows it before it loads, and how it loads (blocking, in a thread)."""

    @property
    def codec(self) -> PromptCodec: ...

    @property
    def n_ctx_seq(self) -> int: ...

    @property
    def need_bytes(self) -> int:
        """Memory the loaded model takes: weights, KV cache and buffers, as sizing counts them."""
        ...

    @property
    def refusal(self) -> str | None:
        """Why it can never load here (it does not fit this machine as asked), else None."""
        ...

    def facts(self) -> dict[str, Any]:
        """describe()'s facts while the model is not loaded."""
        ...

    def load(self) -> InferenceBackend: ...

    def close(self) -> None:
        """Free what the source itself holds (its vocab-only load)."""
        ...


class ModelNotLoaded(RequestRejected):
    """A request for a model that is not loaded, on a server started with --no-models-autoload."""


class ModelTooLarge(RequestRejected):
    """A model whose need alone is more than the pool's memory budget."""


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


class _Releasing:
    """An EventStream that gives its model back to the pool once it ends, however it ends."""

    def __init__(self, stream: EventStream, release: Callable[[], None]) -> None:
        self.request_id = stream.request_id
        self._stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        try:
            async for event in self._stream:
                yield event
        finally:
            self._done()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._done()

    def _done(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class PooledModel:
    """One model of a `ModelPool`; satisfies `InferenceBackend` (and `ManagedBackend`)."""

    def __init__(self, name: str, source: ModelSource, pool: ModelPool, preload: bool = False) -> None:
        """preload: loaded when the server starts (one -m with --sleep-idle-seconds), not on demand."""
        self.name = name
        self.preload = preload
        self.source = source
        self.backend: InferenceBackend | None = None
        self.loading = False
        self.inflight = 0  # requests running or waiting for the load: never unloaded under them
        self.last_used = 0.0
        self.expires_at: float | None = None  # time.monotonic(): unloaded then if still idle
        self.timer: asyncio.TimerHandle | None = None
        self.keep_alive: float | None = None  # seconds idle before unloading (Ollama's keep_alive)
        self.error: str | None = None  # the last load's failure
        self._pool = pool
        self._load_task: asyncio.Future[None] | None = None

    @property
    def status(self) -> Status:
        if self.backend is not None:
            return "loaded"
        return "loading" if self.loading or self._load_task is not None else "unloaded"

    @property
    def codec(self) -> PromptCodec:
        return self.source.codec

    @property
    def n_ctx_seq(self) -> int:
        return self.backend.n_ctx_seq if self.backend is not None else self.source.n_ctx_seq

    async def submit(self, request: Any) -> EventStream:
        backend = await self._pool.acquire(self)
        try:
            stream = await backend.submit(request)
        except BaseException:
            self._pool.release(self)
            raise
        return _Releasing(stream, lambda: self._pool.release(self))

    async def abort(self, request_id: str) -> None:
        if self.backend is not None:
            await self.backend.abort(request_id)

    async def embed(self, texts: Any) -> tuple[list[list[float]], int]:
        async with self._pool.using(self) as backend:
            return await backend.embed(texts)

    async def rerank(self, query: str, documents: Any) -> tuple[list[float], int]:
        async with self._pool.using(self) as backend:
            return await backend.rerank(query, documents)

    async def slot_action(self, action: Any) -> Any:
        async with self._pool.using(self) as backend:
            return await backend.slot_action(action)

    def lora_adapters(self) -> list[LoraAdapter]:
        return self._loaded_backend("its LoRA adapters").lora_adapters()

    def set_lora_scales(self, scales: LoraScales) -> None:
        self._loaded_backend("its LoRA adapters").set_lora_scales(scales)

    def _loaded_backend(self, what: str) -> InferenceBackend:
        if self.backend is None:
            raise NotSupported(f"the model {self.name!r} is not loaded: load it to see or set {what}")
        return self.backend

    def stats(self) -> BackendStats:
        return self.backend.stats() if self.backend is not None else BackendStats()

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return self.backend.cached_sequences() if self.backend is not None else []

    def describe(self) -> dict[str, Any]:
        facts = self.backend.describe() if self.backend is not None else self.source.facts()
        return {**facts, "status": self.status}

    def load(self) -> Awaitable[None]:
        """Load now (llama-server's POST /models/load, Ollama's empty request), without a request:
        the status is "loading" from this call on; await the result for the outcome."""
        return self._pool.begin_load(self)

    async def unload(self) -> bool:
        """Unload now if idle (False: requests are in flight, or it was not loaded)."""
        return await self._pool.unload_idle(self)

    def expires_in(self) -> float | None:
        """Seconds until an idle model unloads (None: not loaded, busy, or kept until unloaded)."""
        if self.backend is None or self.expires_at is None:
            return None
        return max(0.0, self.expires_at - time.monotonic())

    def keep_for(self, seconds: float | None) -> None:
        """How long the model stays loaded once idle, from the next release on (None: the server's
        rule; < 0: until unloaded by hand or for room)."""
        self.keep_alive = seconds

    def close(self) -> None:
        backend, self.backend = self.backend, None
        if backend is not None:
            backend.close()
        self.source.close()


class ModelPool:
    """The models one server may serve and the rules for which are loaded (see the module docstring)."""

    def __init__(
        self, sources: Mapping[str, ModelSource], limits: PoolLimits, preload: tuple[str, ...] = ()
    ) -> None:
        self.limits = limits
        self.models = {
            name: PooledModel(name, source, self, name in preload) for name, source in sources.items()
        }
        self._lock = asyncio.Lock()  # one load (and the unloads it makes room with) at a time
        self._released = asyncio.Event()  # set whenever a model goes idle: a load waiting for room
        self._expiring: set[asyncio.Future[bool]] = set()

    def loaded(self) -> list[PooledModel]:
        return [m for m in self.models.values() if m.backend is not None]

    async def acquire(self, model: PooledModel) -> InferenceBackend:
        """The model's backend, loaded first if it is not; counted in flight until `release`."""
        model.inflight += 1  # a waiter counts: the model is not unloaded while it waits
        _disarm(model)
        try:
            if model.backend is None:
                if not self.limits.autoload:
                    raise ModelNotLoaded(
                        f"the model {model.name!r} is not loaded; load it with POST /models/load"
                    )
                await self._wait_loaded(model)
            assert model.backend is not None
            model.last_used = time.monotonic()
            return model.backend
        except BaseException:
            self.release(model)
            raise

    def release(self, model: PooledModel) -> None:
        model.inflight -= 1
        model.last_used = time.monotonic()
        if model.inflight == 0:
            self._released.set()
            self._arm_expiry(model)

    @contextlib.asynccontextmanager
    async def using(self, model: PooledModel) -> AsyncIterator[InferenceBackend]:
        backend = await self.acquire(model)
        try:
            yield backend
        finally:
            self.release(model)

    async def unload_idle(self, model: PooledModel) -> bool:
        if model.backend is None or model.inflight:  # not waiting for the lock a load may hold
            return False
        async with self._lock:
            if model.backend is None or model.inflight:
                return False
            await self._unload(model)
            return True

    def _arm_expiry(self, model: PooledModel) -> None:
        """Unload the idle model once its keep-alive (or the server's idle time) has passed."""
        _disarm(model)
        keep = model.keep_alive if model.keep_alive is not None else self.limits.idle_unload_s
        if keep is None or keep < 0 or model.backend is None:
            return
        loop = asyncio.get_running_loop()
        model.expires_at = model.last_used + keep
        # acquire() cancels the timer: one that fires finds its model idle since it was armed
        model.timer = loop.call_later(keep, self._expire, model)

    def _expire(self, model: PooledModel) -> None:
        task = asyncio.ensure_future(self.unload_idle(model))
        self._expiring.add(task)  # held until done: the loop keeps only a weak reference to a task
        task.add_done_callback(self._expiring.discard)

    def begin_load(self, model: PooledModel) -> asyncio.Future[None]:
        """The model's load, started now unless it is loaded or loading already."""
        if model._load_task is None:
            model._load_task = asyncio.ensure_future(self._load(model))
            model._load_task.add_done_callback(_retrieve)
        return model._load_task

    async def _wait_loaded(self, model: PooledModel) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.begin_load(model)), self.limits.load_wait_s)
        except TimeoutError:
            if model.loading:
                why = f"the model {model.name!r} is still loading; retry shortly"
            else:
                why = f"no room to load {model.name!r}: {self._busy()} are busy"
            raise BackendUnavailable(why, retry_after=5) from None

    def _busy(self) -> str:
        return ", ".join(repr(m.name) for m in self.loaded() if m.inflight) or "the loaded models"

    async def _load(self, model: PooledModel) -> None:
        try:
            async with self._lock:
                if model.backend is not None:
                    return
                await self._make_room(model)
                model.loading = True
                started = time.monotonic()
                _log.info("loading model %s", model.name)
                try:
                    backend = await asyncio.to_thread(model.source.load)
                except Exception as exc:
                    model.error = " ".join(str(exc).split()) or type(exc).__name__
                    _log.error("model %s failed to load: %s", model.name, model.error)
                    raise BackendUnavailable(
                        f"the model {model.name!r} failed to load: {model.error}"
                    ) from exc
                finally:
                    model.loading = False
                model.backend, model.error = backend, None
                model.last_used = time.monotonic()
                _log.info("loaded model %s in %.1f s", model.name, model.last_used - started)
                if model.inflight == 0:  # loaded by hand or at start: idle from now
                    self._arm_expiry(model)
        finally:
            model._load_task = None

    async def _make_room(self, model: PooledModel) -> None:
        """Unload idle models, least recently used first, until `model` fits; wait (bounded) while
        the ones in the way are busy."""
        budget, need = self.limits.memory_bytes, model.source.need_bytes
        if model.source.refusal is not None:
            raise ModelTooLarge(f"the model {model.name!r} cannot be loaded here: {model.source.refusal}")
        if budget and need > budget:
            raise ModelTooLarge(
                f"the model {model.name!r} needs {_gib(need)} of memory; this server has "
                f"{_gib(budget)} for its models"
            )
        deadline = time.monotonic() + self.limits.load_wait_s
        while not self._fits(model):
            idle = [m for m in self.loaded() if m is not model and m.inflight == 0]
            if idle:
                await self._unload(min(idle, key=lambda m: m.last_used))
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                why = f"no room to load {model.name!r}: {self._busy()} are busy"
                raise BackendUnavailable(why, retry_after=5)
            self._released.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._released.wait(), left)

    def _fits(self, model: PooledModel) -> bool:
        others = [m for m in self.loaded() if m is not model]
        limits = self.limits
        count_ok = not limits.models_max or len(others) < limits.models_max
        used = sum(m.source.need_bytes for m in others)
        return count_ok and (not limits.memory_bytes or used + model.source.need_bytes <= limits.memory_bytes)

    async def _unload(self, model: PooledModel) -> None:
        backend, model.backend = model.backend, None
        _disarm(model)
        if backend is not None:
            _log.info("unloading model %s", model.name)
            await asyncio.to_thread(backend.close)


def _disarm(model: PooledModel) -> None:
    if model.timer is not None:
        model.timer.cancel()
    model.timer, model.expires_at = None, None


def _retrieve(task: asyncio.Future[None]) -> None:
    """A load nobody waits for any more still has its failure read (no 'never retrieved' warning)."""
    if not task.cancelled():
        task.exception()
