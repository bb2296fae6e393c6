"""Ollama's API over an in-memory backend, driven by the real `ollama` client in process (ASGI):
chat and generate streamed and not, options, format, tools, thinking, the model routes, and
Ollama's `{"error": ...}` envelope by raw HTTP for what the client does not send."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import ollama
import pytest
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.settings import HttpSettings

T = TypeVar("T")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS: list[Any] = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path))
    return tmp_path


def run(
    backend: FakeBackend,
    go: Callable[[ollama.AsyncClient, httpx.AsyncClient], Awaitable[T]],
    more: dict[str, FakeBackend] | None = None,
) -> T:
    async def main() -> T:
        app = create_app({"m": backend, **(more or {})}, HttpSettings(), "m")
        transport = httpx.ASGITransport(app=app)
        client = ollama.AsyncClient(host="http://test", transport=transport)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await go(client, http)

    return asyncio.run(main())


def prompt_of(backend: FakeBackend, i: int = -1) -> str:
    return "".join(chr(t) for t in backend.submitted[i].prompt_tokens)


def test_chat_whole_and_streamed_with_counts_and_options() -> None:
    backend = FakeBackend("hello")

    async def go(client: ollama.AsyncClient, _: httpx.AsyncClient) -> None:
        msgs = [{"role": "user", "content": "hi"}]
        whole = await client.chat("any-name", messages=msgs, stream=False)
        assert whole.message.content == "hello" and whole.done and whole.done_reason == "stop"
        assert whole.eval_count == 5 and whole.prompt_eval_count == len(prompt_of(backend))
        assert whole.total_duration and whole.total_duration > 0 and whole.model == "any-name"
        opts = {
            "num_predict": 2,
            "temperature": 0.3,
            "top_k": 7,
            "top_p": 0.5,
            "seed": 11,
            "repeat_penalty": 1.2,
        }
        parts = [p async for p in await client.chat("m", messages=msgs, stream=True, options=opts)]
        assert "".join(p.message.content or "" for p in parts) == "he"
        assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
        assert parts[-1].done_reason == "length" and parts[-1].eval_count == 2
        sampling = backend.submitted[-1].sampling
        assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.3, 7, 0.5)
        assert (sampling.seed, sampling.repeat_penalty) == (11, 1.2)

    run(backend, go)
    assert prompt_of(backend) == "user: hi\nassistant: "


def test_generate_applies_the_template_with_system_and_stop() -> None:
    backend = FakeBackend("one, two")

    async def go(client: ollama.AsyncClient, _: httpx.AsyncClient) -> None:
        whole = await client.generate("m", "count", system="be brief", stream=False, options={"stop": [","]})
        assert whole.response == "one, two" and whole.done_reason == "stop"  # the engine applies stops
        assert backend.submitted[-1].stop == (",",)
        parts = [p async for p in await client.generate("m", "count", stream=True)]
        assert "".join(p.response for p in parts) == "one, two" and parts[-1].done
        loaded = await client.generate("m", "")  # Ollama's way to load a model
        assert loaded.done_reason == "load" and loaded.response == ""

    run(backend, go)
    assert prompt_of(backend, 0) == "system: be brief\nuser: count\nassistant: "


def test_tools_thinking_and_format() -> None:
    backend = FakeBackend(CALL, n_ctx_seq=4096)

    async def go(client: ollama.AsyncClient, _: httpx.AsyncClient) -> None:
        msgs: list[Any] = [{"role": "user", "content": "weather?"}]
        reply = await client.chat("m", messages=msgs, tools=TOOLS, stream=False)
        calls = reply.message.tool_calls or []
        assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
            ("get_weather", {"city": "Oslo"})
        ]
        backend.reply = "sunny"
        history = [*msgs, reply.message, {"role": "tool", "content": "12C", "tool_name": "get_weather"}]
        follow = await client.chat("m", messages=history, tools=TOOLS, stream=False)
        assert follow.message.content == "sunny"
        assert "12C" in prompt_of(backend)
        backend.reply = "<think>Two and two.</think>It is 4."
        thought = await client.chat("m", messages=msgs, think=True, stream=False)
        assert (thought.message.thinking, thought.message.content) == ("Two and two.", "It is 4.")
        backend.reply = '{"a": 1}'
        await client.chat("m", messages=msgs, format="json", stream=False)
        assert backend.submitted[-1].sampling.grammar
        await client.chat("m", messages=msgs, format=WEATHER, stream=False)
        assert "city" in (backend.submitted[-1].sampling.grammar or "")

    run(backend, go)


def test_model_routes_and_embeddings() -> None:
    backend = FakeBackend("hello")

    async def go(client: ollama.AsyncClient, http: httpx.AsyncClient) -> None:
        assert [m.model for m in (await client.list()).models] == ["m"]
        running = (await client.ps()).models
        assert [m.model for m in running] == ["m"] and running[0].context_length == 256
        shown = await client.show("m:latest")
        assert shown.template == "fake" and "completion" in (shown.capabilities or [])
        vectors = await client.embed("m", ["ab", "abc"])
        assert vectors.embeddings == [[2.0, 0.0], [3.0, 1.0]] and vectors.prompt_eval_count == 2
        old = await client.embeddings("m", "abcd")
        assert list(old.embedding) == [4.0, 0.0]
        version = (await http.get("/api/version")).json()
        assert version["version"]

    run(backend, go)


def test_errors_are_ollamas_envelope() -> None:
    backend = FakeBackend("hello")

    async def go(client: ollama.AsyncClient, http: httpx.AsyncClient) -> None:
        with pytest.raises(ollama.ResponseError) as unknown:
            await client.chat("nope", messages=[{"role": "user", "content": "hi"}])
        assert unknown.value.status_code == 404 and unknown.value.error == "model 'nope' not found"
        with pytest.raises(ollama.ResponseError) as unshown:
            await client.show("nope")
        assert unshown.value.status_code == 404
        with pytest.raises(ollama.ResponseError) as missing:
            await client.delete("nope")
        assert missing.value.status_code == 404
        image = {"role": "user", "content": "what is this", "images": ["aGk="]}
        r = await http.post("/api/chat", json={"model": "m", "messages": [image]})
        assert r.status_code == 400 and "images" in r.json()["error"]
        r = await http.post("/api/generate", json={"model": "m", "prompt": "x", "images": ["aGk="]})
        assert r.status_code == 400 and set(r.json()) == {"error"}
        r = await http.post("/api/chat", content=b"{not json")
        assert r.status_code == 400 and "JSON" in r.json()["error"]
        r = await http.post(
            "/api/chat", json={"model": "m", "messages": [{"role": "user", "content": "x" * 300}]}
        )
        assert r.status_code == 400 and "context" in r.json()["error"]
        r = await http.post(
            "/api/chat",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "options": {"temperature": -1},
            },
        )
        assert r.status_code == 400 and "temperature" in r.json()["error"]

    run(backend, go, {"other": FakeBackend("x")})


def test_keep_alive_and_num_ctx_are_accepted_and_change_nothing() -> None:
    backend = FakeBackend("hello")

    async def go(client: ollama.AsyncClient, _: httpx.AsyncClient) -> None:
        msgs = [{"role": "user", "content": "hi"}]
        reply = await client.chat("m", messages=msgs, keep_alive=0, options={"num_ctx": 1_000_000})
        assert reply.message.content == "hello"
        assert [m.model for m in (await client.ps()).models] == ["m"]  # still loaded: keep_alive is not built
        assert (await client.ps()).models[0].context_length == 256  # the server's context, not num_ctx

    run(backend, go)


def test_refusals_before_a_route_runs_are_ollamas_envelope() -> None:
    async def main() -> None:
        config = HttpSettings(api_keys=("k",), max_body=1024)
        app = create_app({"m": FakeBackend("hello")}, config, "m")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            r = await http.post("/api/chat", json={"model": "m", "messages": []})
            assert r.status_code == 401 and list(r.json()) == ["error"] and "key" in r.json()["error"]
            big = {"model": "m", "messages": [{"role": "user", "content": "x" * 2000}]}
            r = await http.post("/api/chat", json=big, headers={"Authorization": "Bearer k"})
            assert r.status_code == 413 and list(r.json()) == ["error"]

    asyncio.run(main())


def test_raw_generate_sends_the_prompt_as_written_and_continues_from_context() -> None:
    backend = FakeBackend("abc")

    async def go(client: ollama.AsyncClient, http: httpx.AsyncClient) -> None:
        first = await client.generate("m", "Once", raw=True, system="ignored", options={"num_predict": 2})
        assert first.response == "ab" and first.done_reason == "length"
        assert first.context == [ord(c) for c in "Onceab"]
        parts = [
            p async for p in await client.generate("m", " upon", raw=True, context=first.context, stream=True)
        ]
        assert "".join(p.response for p in parts) == "abc" and parts[-1].context
        assert prompt_of(backend) == "Onceab upon"
        r = await http.post("/api/generate", json={"model": "m", "prompt": "x", "context": [1, 2]})
        assert r.status_code == 400 and "raw" in r.json()["error"]
        r = await http.post("/api/generate", json={"model": "m", "prompt": "x", "raw": True, "suffix": "y"})
        assert r.status_code == 400 and "suffix" in r.json()["error"]

    run(backend, go)


def test_pull_progress_skips_a_part_renamed_into_place_while_it_looks(tmp_path: Path) -> None:
    """A download that ends between the progress poll's listing and its stat of the file must not
    end /api/pull's stream mid-body: the vanished part (a dangling link here) is skipped."""
    from outpost.api.ollama.models import _partial_bytes
    from outpost.models.store import ModelStore

    store = ModelStore(tmp_path / "models")
    assert _partial_bytes(store) is None  # no download has started: no partial directory
    store.partial_dir.mkdir(parents=True)
    (store.partial_dir / "gone.part").symlink_to(tmp_path / "renamed-away")
    assert _partial_bytes(store) is None
    (store.partial_dir / "abc.part").write_bytes(b"x" * 7)
    assert _partial_bytes(store) == ("abc", 7)
