"""The API over the `InferenceBackend` protocol, with an in-memory backend (no model, no thread).

What a remote backend (the gateway) relies on: admission errors raised by an *awaited* submit
still become 429/400/503 before any byte of a 200; several models are served by id; unknown
models are 404; /health and /v1/models read the protocol only.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.messages import BackendUnavailable, QueueFull, RequestRejected
from outpost.settings import HttpSettings

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture()
def config() -> HttpSettings:
    return HttpSettings()


def run(coro_fn, backends, config: HttpSettings):  # type: ignore[no-untyped-def]
    async def main():  # type: ignore[no-untyped-def]
        app = create_app(backends, config, "m")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await coro_fn(client)

    return asyncio.run(main())


def test_chat_and_stream_through_the_protocol(config: HttpSettings) -> None:
    backend = FakeBackend("hello")

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        plain = (await client.post("/v1/chat/completions", json=CHAT)).json()
        chunks = []
        async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
        return plain, chunks

    plain, chunks = run(go, {"m": backend}, config)
    assert plain["choices"][0]["message"]["content"] == "hel"
    assert plain["choices"][0]["finish_reason"] == "length"
    assert plain["model"] == "m"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "hel"
    # The prompt went through the codec's chat rendering.
    assert FakeBackend().codec.detokenize(backend.submitted[0].prompt_tokens) == "user: hi\nassistant: "


@pytest.mark.parametrize(
    ("refusal", "status", "retry_after"),
    [
        (QueueFull("queue is full"), 429, True),
        (RequestRejected("too long"), 400, False),
        (BackendUnavailable("broker unreachable", retry_after=3), 503, True),
    ],
)
def test_an_awaited_refusal_is_an_error_status_before_any_stream_byte(
    config: HttpSettings, refusal: BaseException, status: int, retry_after: bool
) -> None:
    backend = FakeBackend()
    backend.admit.clear()  # submit awaits, as a publisher confirm does
    backend.refuse = refusal

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        request = asyncio.ensure_future(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
        for _ in range(1000):  # until the handler is parked in submit
            if request.done():
                break
            await asyncio.sleep(0)
        assert not request.done()
        backend.admit.set()
        return await request

    r = run(go, {"m": backend}, config)
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    assert "error" in r.json()
    assert ("retry-after" in r.headers) == retry_after
    if isinstance(refusal, BackendUnavailable):
        assert r.headers["retry-after"] == "3"


def test_models_by_id_and_unknown_model_is_404(config: HttpSettings) -> None:
    a, b = FakeBackend("aaaa"), FakeBackend("bbbb")

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        models = (await client.get("/v1/models")).json()
        to_b = (await client.post("/v1/chat/completions", json={**CHAT, "model": "b"})).json()
        unknown = await client.post("/v1/chat/completions", json={**CHAT, "model": "zzz"})
        health = await client.get("/health")
        return models, to_b, unknown, health

    models, to_b, unknown, health = run(go, {"a": a, "b": b}, config)
    assert [m["id"] for m in models["data"]] == ["a", "b"]
    assert models["data"][0]["meta"]["architecture"] == "fake"
    assert to_b["choices"][0]["message"]["content"] == "bbb"
    assert to_b["model"] == "b"
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    assert health.status_code == 200
    assert health.json()["slots_total"] == 2


@pytest.mark.parametrize(
    "refusal", [QueueFull("queue is full"), BackendUnavailable("broker unreachable", retry_after=3)]
)
def test_embeddings_refused_by_a_broker_answer_as_chat_does(
    config: HttpSettings, refusal: BaseException
) -> None:
    backend = FakeBackend()
    backend.refuse = backend.refuse_embed = refusal

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        chat = await client.post("/v1/chat/completions", json=CHAT)
        embeddings = await client.post("/v1/embeddings", json={"input": "hi"})
        return chat, embeddings

    chat, embeddings = run(go, {"m": backend}, config)
    assert embeddings.status_code == chat.status_code in (429, 503)
    assert embeddings.json()["error"]["code"] == chat.json()["error"]["code"]
    assert embeddings.headers.get("retry-after") == chat.headers.get("retry-after") is not None


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (TimeoutError("the request's deadline passed in the queue"), 504, "timeout"),
        (ValueError("input 0 has 3000 tokens; the embedding context holds 2048"), 400, None),
        (RuntimeError("embedding decode failed with code 2"), 500, "engine_error"),
    ],
)
def test_embedding_failures_are_openai_errors(
    config: HttpSettings, failure: BaseException, status: int, code: str | None
) -> None:
    backend = FakeBackend()
    backend.refuse_embed = failure

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        return await client.post("/v1/embeddings", json={"input": ["a", "b"]})

    r = run(go, {"m": backend}, config)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    if status == 400:
        assert r.json()["error"]["param"] == "input"
        assert str(failure) in r.json()["error"]["message"]


def test_embeddings_go_to_the_named_model(config: HttpSettings) -> None:
    a, b = FakeBackend(), FakeBackend()

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        to_b = (await client.post("/v1/embeddings", json={"input": "xyz", "model": "b"})).json()
        default = (await client.post("/v1/embeddings", json={"input": "q"})).json()
        unknown = await client.post("/v1/embeddings", json={"input": "q", "model": "zzz"})
        return to_b, default, unknown

    to_b, default, unknown = run(go, {"a": a, "b": b}, config)
    assert b.embedded == [["xyz"]] and a.embedded == [["q"]]
    assert to_b["model"] == "b" and default["model"] == "a"
    assert to_b["data"][0]["embedding"] == [3.0, 0.0]
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "x" * 50, "max_tokens": 20}),  # prompt + max_tokens too long
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 80}], "max_tokens": 2}),
    ],
    ids=["max_tokens", "prompt"],
)
def test_a_worker_refusing_after_the_200_answers_the_400_serve_gives(
    config: HttpSettings, path: str, body: dict[str, object]
) -> None:
    """A gateway believed its workers held 256 positions; the one that took the request holds 64
    (it joined after the check). Its refusal reaches the client as the body a 64-position server
    answers before accepting: the 400 itself when not streamed, an SSE error event after the 200."""
    small = FakeBackend(n_ctx_seq=64)
    racing = FakeBackend(n_ctx_seq=256)
    racing.worker_n_ctx_seq = 64

    async def go(client: httpx.AsyncClient):  # type: ignore[no-untyped-def]
        direct = await client.post(path, json={**body, "model": "small"})
        plain = await client.post(path, json={**body, "model": "racing"})
        streamed = await client.post(path, json={**body, "model": "racing", "stream": True})
        return direct, plain, streamed

    direct, plain, streamed = run(go, {"small": small, "racing": racing}, config)
    assert direct.status_code == 400 and direct.json()["error"]["code"] == "context_length_exceeded"
    assert "64" in direct.json()["error"]["message"]
    error = direct.json()["error"]  # llama-server's type and figures beside OpenAI's code
    assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 64
    assert error["n_prompt_tokens"] > 0
    assert (plain.status_code, plain.json()) == (400, direct.json())
    assert streamed.status_code == 200
    events = [line[6:] for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert json.loads(events[-2]) == direct.json() and events[-1] == "[DONE]"
    assert not small.submitted  # decided before submitting, as on serve
