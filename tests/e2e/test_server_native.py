"""llama-server's native API on a real `outpost serve` (synthetic GGUF), called as llama-server's
web UI and scripts call it: raw HTTP for /completion, /infill, /props, /slots; the `openai` client
for n > 1, grammar and token-id embeddings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from server_harness import Server, start

MODEL = "tiny-f16"


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, "-np", "2", "-c", "1024") as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_completion_text_tokens_and_probabilities(http: httpx.Client) -> None:
    body = {"prompt": "The sky is", "n_predict": 6, "temperature": 0, "return_tokens": True, "n_probs": 3}
    res = http.post("/completion", json=body).json()
    assert res["stop"] is True and res["stop_type"] in ("limit", "eos")
    assert len(res["tokens"]) == res["tokens_predicted"] <= 6 and res["tokens_evaluated"] > 0
    assert http.post("/detokenize", json={"tokens": res["tokens"]}).json()["content"] == res["content"]
    probs = res["completion_probabilities"]
    assert [p["id"] for p in probs] == res["tokens"] and all(len(p["top_logprobs"]) == 3 for p in probs)
    ids = http.post("/tokenize", json={"content": "The sky is", "add_special": True}).json()["tokens"]
    again = http.post("/completion", json={**body, "prompt": ids}).json()
    assert again["tokens"] == res["tokens"]  # greedy: the same prompt as ids gives the same tokens


def test_completion_stream_ends_with_a_stop_chunk(http: httpx.Client) -> None:
    body = {"prompt": "Once", "n_predict": 5, "stream": True, "temperature": 0}
    with http.stream("POST", "/completion", json=body) as r:
        lines = [line for line in r.iter_lines() if line]
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines]
    assert chunks[-1]["stop"] is True and "timings" in chunks[-1]
    assert all(not c["stop"] for c in chunks[:-1])
    plain = http.post("/completion", json={**body, "stream": False}).json()
    assert "".join(c["content"] for c in chunks) == plain["content"]


def test_grammar_constrains_and_a_bad_one_is_400(http: httpx.Client) -> None:
    body = {"prompt": "Answer:", "n_predict": 8, "grammar": 'root ::= "yes" | "no"\n'}
    assert http.post("/completion", json=body).json()["content"] in ("yes", "no")
    bad = http.post("/completion", json={**body, "grammar": "root ::= maybe\n"})
    assert bad.status_code == 400 and "maybe" in bad.json()["error"]["message"]


def test_infill_without_fim_tokens_is_501_and_props_slots(http: httpx.Client) -> None:
    r = http.post("/infill", json={"input_prefix": "def f(", "input_suffix": ")"})
    assert r.status_code == 501 and "not supported by this model" in r.json()["error"]["message"]
    props = http.get("/props").json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] > 0
    assert props["model_path"].endswith(".gguf")
    assert len(http.get("/slots").json()) == 2


def test_n_choices_and_token_id_embeddings(server: Server, http: httpx.Client) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=60)
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2, seed=1
    )
    assert [c.index for c in r.choices] == [0, 1]
    ids = http.post("/tokenize", json={"content": "a red apple", "add_special": True}).json()["tokens"]
    by_text = client.embeddings.create(model=MODEL, input="a red apple").data[0].embedding
    by_ids = client.embeddings.create(model=MODEL, input=[ids, ids[:2]])
    assert len(by_ids.data) == 2 and by_ids.data[0].embedding == pytest.approx(by_text, abs=1e-5)
    bad = http.post("/v1/embeddings", json={"input": [10**9]})
    assert bad.status_code == 400 and "out of range" in bad.json()["error"]["message"]
