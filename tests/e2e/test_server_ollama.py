"""Ollama's API on a real `outpost serve` (the synthetic model), driven by the `ollama` client from
PyPI as its users drive it: list, ps, show, chat streamed and not, generate, embed; pull from the
fake hub and delete on a server with its own model store; raw HTTP for what the client lacks
(NDJSON framing, the images refusal, the error envelope)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import ollama
import pytest
from fakehub import FakeHub
from server_harness import Server, start

from outpost.models.catalog import parse_model_ref

SMOL = parse_model_ref("smollm2:135m").entry
assert SMOL is not None
HI = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, "-np", "2", "-c", "2048", "--default-max-tokens", "8") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=60)


def test_list_ps_show_version(client: ollama.Client, server: Server) -> None:
    assert "tiny-f16" in [m.model for m in client.list().models]
    loaded = client.ps().models
    assert [m.model for m in loaded] == ["tiny-f16"] and loaded[0].context_length
    shown = client.show("tiny-f16")
    assert shown.template and "completion" in (shown.capabilities or [])
    assert (shown.modelinfo or {}).get("general.architecture")
    assert httpx.get(f"{server.url}/api/version").json()["version"]


def test_chat_whole_and_streamed(client: ollama.Client) -> None:
    whole = client.chat("anything", messages=HI, options={"temperature": 0, "num_predict": 6})
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.eval_count is not None and 1 <= whole.eval_count <= 6
    assert whole.prompt_eval_count and whole.total_duration and whole.eval_duration
    assert whole.total_duration >= whole.eval_duration
    parts = list(
        client.chat("tiny-f16", messages=HI, stream=True, options={"temperature": 0, "num_predict": 6})
    )
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content  # greedy: the same text
    assert parts[-1].eval_count == whole.eval_count


def test_generate_and_embed(client: ollama.Client) -> None:
    reply = client.generate("tiny-f16", "Count:", options={"num_predict": 4, "seed": 3})
    assert reply.done and reply.eval_count is not None and reply.eval_count <= 4
    assert reply.done_reason in ("stop", "length")
    raw = client.generate("tiny-f16", "Count: 1, 2,", raw=True, options={"num_predict": 4, "temperature": 0})
    assert raw.context and raw.prompt_eval_count and raw.eval_count is not None
    assert len(raw.context) == raw.prompt_eval_count + raw.eval_count
    vectors = client.embed("tiny-f16", ["one", "two words"])
    assert len(vectors.embeddings) == 2 and len(vectors.embeddings[0]) == len(vectors.embeddings[1]) > 0
    assert client.embeddings("tiny-f16", "one").embedding == pytest.approx(vectors.embeddings[0], abs=1e-5)


def test_raw_http_ndjson_and_errors(server: Server) -> None:
    with server.client() as http:
        body = {"model": "tiny-f16", "messages": HI, "options": {"num_predict": 3}}
        with http.stream("POST", "/api/chat", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert lines[-1]["done"] is True and lines[-1]["eval_count"] <= 3
        image = [{"role": "user", "content": "what is this?", "images": ["aGk="]}]
        r = http.post("/api/chat", json={"model": "tiny-f16", "messages": image})
        assert r.status_code == 400 and "images" in r.json()["error"]
        r = http.post("/api/show", json={"model": "nope"})
        assert r.status_code == 404 and r.json() == {"error": "model 'nope' not found"}
        r = http.post(
            "/api/chat", json={"model": "tiny-f16", "messages": HI, "options": {"num_predict": 99999}}
        )
        assert r.status_code == 400 and "context" in r.json()["error"]


def test_pull_from_the_hub_then_delete(fake_hub: FakeHub, tiny_model: Path, tmp_path: Path) -> None:
    assert SMOL is not None
    fake_hub.add_repo(SMOL.repo, {SMOL.filename("f16"): tiny_model})
    home = tmp_path / "home"
    with start(tiny_model, "-c", "512", env={"OUTPOST_HOME": str(home)}) as srv:
        client = ollama.Client(host=srv.url, timeout=120)
        progress = list(client.pull("smollm2:135m-f16", stream=True))
        assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
        done = [p for p in progress if p.status == "downloading" and p.total]
        assert done and done[-1].completed == done[-1].total == tiny_model.stat().st_size
        names = [m.model for m in client.list().models]
        stored = [n for n in names if n != "tiny-f16"]
        assert len(stored) == 1 and "smollm2" in stored[0]
        assert client.show(stored[0]).details.format == "gguf"
        client.delete(stored[0])
        assert [m.model for m in client.list().models] == ["tiny-f16"]
        with pytest.raises(ollama.ResponseError) as gone:
            client.delete(stored[0])
        assert gone.value.status_code == 404
        failed = httpx.post(
            f"{srv.url}/api/pull", json={"model": "nobody/nothing-GGUF", "stream": False}, timeout=60
        )
        assert failed.status_code == 400 and "nobody/nothing-GGUF" in failed.json()["error"]
