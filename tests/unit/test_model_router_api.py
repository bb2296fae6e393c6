"""llama-server's router routes and Ollama's load/unload over a pool of in-memory models, by raw HTTP
with llama-server's bodies and with the `ollama` client: GET /models' status, POST /models/load and
/models/unload with their statuses, a request loading its model, /api/ps and keep_alive."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import ollama
from fake_backend import FakeBackend
from test_model_pool import FakeSource, until

from outpost.api.app import create_app
from outpost.serving.model_pool import ModelPool, PoolLimits
from outpost.settings import HttpSettings

T = TypeVar("T")
CHAT = {"model": "b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def run(pool: ModelPool, go: Callable[[httpx.AsyncClient, ollama.AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        app = create_app(dict(pool.models), HttpSettings(), next(iter(pool.models)))
        transport = httpx.ASGITransport(app=app)
        client = ollama.AsyncClient(host="http://test", transport=transport)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await asyncio.wait_for(go(http, client), 60)

    return asyncio.run(main())


async def statuses(http: httpx.AsyncClient) -> dict[str, Any]:
    r = await http.get("/models")
    assert r.status_code == 200 and r.json()["object"] == "list"
    return {card["id"]: card["status"]["value"] for card in r.json()["data"]}


def test_get_models_shows_each_state_and_a_request_loads_its_model() -> None:
    pool = ModelPool({"a": FakeSource(), "b": FakeSource()}, PoolLimits())

    async def go(http: httpx.AsyncClient, _: ollama.AsyncClient) -> None:
        assert await statuses(http) == {"a": "unloaded", "b": "unloaded"}
        r = await http.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "hell"
        assert await statuses(http) == {"a": "unloaded", "b": "loaded"}
        v1 = (await http.get("/v1/models")).json()["data"]
        assert [c["status"]["value"] for c in v1] == ["unloaded", "loaded"]  # the same list

    run(pool, go)


def test_load_and_unload_answer_as_llama_server() -> None:
    a = FakeSource()
    a.gate.clear()  # the load is held: the reply comes first, as llama-server's
    pool = ModelPool({"a": a, "b": FakeSource()}, PoolLimits())

    async def go(http: httpx.AsyncClient, _: ollama.AsyncClient) -> None:
        r = await http.post("/models/load", json={"model": "a"})
        assert r.status_code == 200 and r.json() == {"success": True}
        assert (await statuses(http))["a"] == "loading"
        a.gate.set()
        await until(lambda: pool.models["a"].status == "loaded")
        again = await http.post("/models/load", json={"model": "a"})
        assert again.status_code == 400 and "already running" in again.json()["error"]["message"]
        unknown = await http.post("/models/load", json={"model": "zz"})
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        r = await http.post("/models/unload", json={"model": "a"})
        assert r.status_code == 200 and r.json() == {"success": True}
        assert (await statuses(http))["a"] == "unloaded"
        not_running = await http.post("/models/unload", json={"model": "a"})
        assert not_running.status_code == 400 and "not running" in not_running.json()["error"]["message"]
        assert (await http.post("/models/unload", json={"model": "zz"})).status_code == 400
        missing = await http.post("/models/load", json={})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "model"

    run(pool, go)


def test_unloading_a_model_with_a_request_in_flight_is_a_409_and_it_stays() -> None:
    b = FakeSource()
    pool = ModelPool({"a": FakeSource(), "b": b}, PoolLimits())

    async def go(http: httpx.AsyncClient, _: ollama.AsyncClient) -> None:
        await http.post("/v1/chat/completions", json=CHAT)
        b.backends[0].pace.clear()
        running = asyncio.ensure_future(http.post("/v1/chat/completions", json=CHAT))
        await until(lambda: b.backends[0].running == 1)
        r = await http.post("/models/unload", json={"model": "b"})
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_busy"
        b.backends[0].pace.set()
        assert (await running).status_code == 200 and pool.models["b"].status == "loaded"

    run(pool, go)


def test_without_autoload_a_request_is_a_400_until_post_models_load() -> None:
    pool = ModelPool({"a": FakeSource(), "b": FakeSource()}, PoolLimits(autoload=False))

    async def go(http: httpx.AsyncClient, _: ollama.AsyncClient) -> None:
        r = await http.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 400 and "not loaded" in r.json()["error"]["message"]
        await http.post("/models/load", json={"model": "b"})
        await until(lambda: pool.models["b"].status == "loaded")
        assert (await http.post("/v1/chat/completions", json=CHAT)).status_code == 200

    run(pool, go)


def test_ollama_loads_unloads_and_lists_what_is_loaded() -> None:
    pool = ModelPool({"a": FakeSource(), "b": FakeSource()}, PoolLimits())

    async def go(http: httpx.AsyncClient, client: ollama.AsyncClient) -> None:
        assert (await client.ps()).models == []
        loaded = await client.generate("b")  # `ollama run b` with no prompt: load it
        assert loaded.done_reason == "load" and pool.models["b"].status == "loaded"
        [entry] = (await client.ps()).models
        assert entry.model == "b" and entry.expires_at is not None and entry.expires_at.year == 9999
        answer = await client.chat("b", messages=[{"role": "user", "content": "hi"}], keep_alive="1h")
        assert answer.message.content == "hello"
        await until(lambda: pool.models["b"].inflight == 0)  # the reply is out before its stream closes
        [entry] = (await client.ps()).models
        assert entry.expires_at is not None and entry.expires_at.year < 9999  # an hour from now
        stopped = await client.generate("b", keep_alive=0)  # `ollama stop b`
        assert stopped.done_reason == "unload" and pool.models["b"].status == "unloaded"
        assert (await client.ps()).models == []
        bad = await http.post("/api/generate", json={"model": "b", "prompt": "x", "keep_alive": "soon"})
        assert bad.status_code == 400 and "keep_alive" in bad.json()["error"]

    run(pool, go)


def test_a_pool_of_one_answers_ollamas_load_and_unload_under_any_name() -> None:
    pool = ModelPool({"a": FakeSource()}, PoolLimits())  # one -m with --sleep-idle-seconds

    async def go(http: httpx.AsyncClient, client: ollama.AsyncClient) -> None:
        assert (await client.generate("what-the-client-calls-it")).done_reason == "load"
        assert pool.models["a"].status == "loaded"
        assert (await client.generate("any", keep_alive=0)).done_reason == "unload"
        assert pool.models["a"].status == "unloaded"

    run(pool, go)


def test_a_one_model_server_answers_the_router_routes_with_501() -> None:
    async def main() -> None:
        app = create_app({"m": FakeBackend()}, HttpSettings(), "m")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            loaded = await http.post("/api/generate", json={"model": "any"})  # Ollama's load: always loaded
            assert loaded.status_code == 200 and loaded.json()["done_reason"] == "load"
            r = await http.post("/models/unload", json={"model": "m"})
            assert r.status_code == 501 and "--models-dir" in r.json()["error"]["message"]
            card = (await http.get("/models")).json()["data"][0]
            assert "status" not in card  # llama-server's non-router shape

    asyncio.run(main())
