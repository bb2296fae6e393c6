"""The model pool with no model: loads on demand, the least recently used idle model unloaded for room
(by count and by memory), never one with a request in flight, bounded waits, keep_alive and idle sleep.
Held with events (a load held on a threading.Event, a stream held on FakeBackend.pace), never raced."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from fake_backend import FakeSource

from outpost.backend import InferenceBackend, ManagedBackend
from outpost.messages import BackendUnavailable, GenerateRequest
from outpost.serving.model_pool import ModelNotLoaded, ModelPool, ModelTooLarge, PooledModel, PoolLimits

T = TypeVar("T")
GIB = 2**30


def pool_of(limits: PoolLimits, **sources: FakeSource) -> ModelPool:
    return ModelPool(sources, limits)


def run(go: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(asyncio.wait_for(go(), 60))


async def answer(model: PooledModel) -> str:
    stream = await model.submit(GenerateRequest(prompt_tokens=[1, 2], max_tokens=8))
    return "".join([e.text async for e in stream])


async def until(check: Callable[[], bool]) -> None:
    """Wait (bounded) for what a timer or a background task does."""
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def test_a_request_loads_its_model_once_and_the_pool_is_a_managed_backend() -> None:
    a = FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(), a=a)
        model = pool.models["a"]
        assert isinstance(model, ManagedBackend) and model.status == "unloaded"
        assert model.n_ctx_seq == 4096 and model.codec.tokenize("hi") == [104, 105]  # before any load
        assert await answer(model) == "hello" and model.status == "loaded"
        assert await answer(model) == "hello"
        assert a.loads == 1 and model.inflight == 0

    run(go)


def test_models_max_unloads_the_least_recently_used_idle_model() -> None:
    a, b, c = FakeSource(), FakeSource(), FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(models_max=2), a=a, b=b, c=c)
        await answer(pool.models["a"])
        await answer(pool.models["b"])
        await answer(pool.models["a"])  # b is now the least recently used
        await answer(pool.models["c"])
        assert [m.name for m in pool.loaded()] == ["a", "c"]
        assert b.backends[0].closed or pool.models["b"].backend is None

    run(go)


def test_the_memory_budget_decides_and_a_model_that_never_fits_is_refused_naming_its_need() -> None:
    a, b, big = FakeSource(6), FakeSource(6), FakeSource(12)

    async def go() -> None:
        pool = pool_of(PoolLimits(models_max=0, memory_bytes=10 * GIB), a=a, b=b, big=big)
        await answer(pool.models["a"])
        await answer(pool.models["b"])  # 6 + 6 > 10: a goes
        assert [m.name for m in pool.loaded()] == ["b"]
        with pytest.raises(ModelTooLarge, match=r"needs 12\.00 GiB of memory; this server has 10\.00 GiB"):
            await answer(pool.models["big"])
        assert [m.name for m in pool.loaded()] == ["b"] and big.loads == 0

    run(go)


def test_a_source_that_cannot_fit_this_machine_is_refused_with_its_reason() -> None:
    odd = FakeSource(refusal="-c 1000000 needs 80 GiB of KV cache")

    async def go() -> None:
        pool = pool_of(PoolLimits(), odd=odd)
        with pytest.raises(ModelTooLarge, match="cannot be loaded here: -c 1000000 needs 80 GiB"):
            await answer(pool.models["odd"])

    run(go)


def test_a_model_with_a_request_in_flight_is_never_unloaded_the_load_waits_for_room() -> None:
    a, b = FakeSource(), FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(models_max=1), a=a, b=b)
        await answer(pool.models["a"])
        held = a.backends[0]
        held.pace.clear()  # a's next stream holds before its first token
        running = asyncio.ensure_future(answer(pool.models["a"]))
        await until(lambda: held.running == 1)
        waiting = asyncio.ensure_future(answer(pool.models["b"]))
        await until(lambda: pool.models["b"].status == "loading")
        assert pool.models["a"].status == "loaded" and b.loads == 0  # not unloaded under its stream
        assert not await pool.models["a"].unload()  # nor by hand
        held.pace.set()
        assert await running == "hello" and await waiting == "hello"
        assert [m.name for m in pool.loaded()] == ["b"]

    run(go)


def test_no_room_within_the_wait_is_a_503_with_retry_after() -> None:
    a, b = FakeSource(), FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(models_max=1, load_wait_s=0.2), a=a, b=b)
        await answer(pool.models["a"])
        a.backends[0].pace.clear()
        running = asyncio.ensure_future(answer(pool.models["a"]))
        await until(lambda: a.backends[0].running == 1)
        with pytest.raises(BackendUnavailable) as refused:
            await answer(pool.models["b"])
        assert refused.value.retry_after > 0 and "no room to load 'b'" in str(refused.value)
        assert pool.models["b"].inflight == 0 and b.loads == 0
        a.backends[0].pace.set()
        await running

    run(go)


def test_a_slow_load_is_a_503_for_the_request_and_goes_on_loading() -> None:
    a = FakeSource()
    a.gate.clear()

    async def go() -> None:
        pool = pool_of(PoolLimits(load_wait_s=0.05), a=a)
        with pytest.raises(BackendUnavailable, match="'a' is still loading"):
            await answer(pool.models["a"])
        assert pool.models["a"].status == "loading"
        a.gate.set()
        await until(lambda: pool.models["a"].status == "loaded")
        assert await answer(pool.models["a"]) == "hello" and a.loads == 1

    run(go)


def test_without_autoload_a_request_for_an_unloaded_model_is_refused_until_it_is_loaded() -> None:
    a = FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(autoload=False), a=a)
        with pytest.raises(ModelNotLoaded, match="POST /models/load"):
            await answer(pool.models["a"])
        await pool.models["a"].load()
        assert await answer(pool.models["a"]) == "hello"

    run(go)


def test_keep_alive_zero_unloads_when_the_request_ends_and_the_next_one_reloads() -> None:
    a = FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(), a=a)
        model = pool.models["a"]
        model.keep_for(0)
        assert await answer(model) == "hello"
        await until(lambda: model.status == "unloaded")
        model.keep_for(-1)  # kept until unloaded: no expiry
        await answer(model)
        assert a.loads == 2 and model.status == "loaded" and model.expires_in() is None
        model.keep_for(3600)
        await answer(model)
        left = model.expires_in()
        assert left is not None and 3500 < left <= 3600

    run(go)


def test_an_idle_model_sleeps_and_wakes_on_its_next_request() -> None:
    a = FakeSource()

    async def go() -> None:
        pool = pool_of(PoolLimits(idle_unload_s=0.05), a=a)
        model = pool.models["a"]
        await answer(model)
        await until(lambda: model.status == "unloaded" and a.backends[0].closed)
        assert await answer(model) == "hello" and a.loads == 2

    run(go)


def test_a_failed_load_is_a_503_naming_the_cause_and_the_model_says_it_failed() -> None:
    a = FakeSource()

    def broken() -> InferenceBackend:
        raise ValueError("llama.cpp could not read a.gguf")

    a.load = broken  # type: ignore[method-assign]

    async def go() -> None:
        pool = pool_of(PoolLimits(), a=a)
        with pytest.raises(
            BackendUnavailable, match=r"'a' failed to load: llama\.cpp could not read a\.gguf"
        ):
            await answer(pool.models["a"])
        assert pool.models["a"].status == "unloaded" and pool.models["a"].error is not None

    run(go)
