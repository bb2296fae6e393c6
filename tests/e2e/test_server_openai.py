"""`outpost serve` through the real `openai` client and httpx: every route, good and bad input."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import Server, assert_openai_error, sse_events, start

MAX_BODY = 65536
MODEL = "tiny-f16"
USER = [{"role": "user", "content": "what color is an apple?"}]


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    srv = start(
        tiny_model, "-np", "4", "-c", "4096", "--default-max-tokens", "16", "--max-body", str(MAX_BODY)
    )
    with srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


def test_models_lists_the_served_model(client: openai.OpenAI, http: httpx.Client) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny-f16"]
    assert http.get("/v1/models/tiny-f16").json()["id"] == "tiny-f16"
    assert http.get("/models").json()["data"][0]["id"] == "tiny-f16"


def test_chat_completion_has_usage_and_timings(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=12, extra_body={"ignore_eos": True}
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12 and r.usage.prompt_tokens > 5
    timings = (r.model_extra or {})["timings"]
    for key in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms"):
        assert key in timings
    assert timings["predicted_n"] == 12 and {"cache_n", "queue_ms", "predicted_per_second"} <= set(timings)


def test_model_field_may_be_omitted_and_max_tokens_defaults(http: httpx.Client) -> None:
    r = http.post("/v1/chat/completions", json={"messages": USER, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 16  # --default-max-tokens


def test_chat_stream_with_include_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=20,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
    assert "timings" in (finish[0].model_extra or {})
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 20


def test_completions_string_and_list(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert r.object == "text_completion" and r.choices[0].text and r.usage and r.usage.completion_tokens == 8
    r2 = client.completions.create(
        model=MODEL, prompt=["One", "Two", "Three"], max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in r2.choices) == [0, 1, 2]
    assert r2.usage is not None and r2.usage.completion_tokens == 15
    stream = client.completions.create(
        model=MODEL, prompt=["a", "b"], max_tokens=6, stream=True, extra_body={"ignore_eos": True}
    )
    per_index: dict[int, str] = {}
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            per_index[c.index] = per_index.get(c.index, "") + c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1} and all(per_index.values())


def test_seed_makes_sampling_repeatable_and_stop_strings_work(client: openai.OpenAI) -> None:
    def ask(seed: int) -> str:
        r = client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=16, seed=seed, temperature=1.0
        )
        return r.choices[0].message.content or ""

    assert ask(7) == ask(7)
    full = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
    )
    text = full.choices[0].message.content or ""
    stop = text[len(text) // 2 :][:3]
    if stop.strip():
        cut = client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=16, temperature=0, stop=[stop]
        )
        assert cut.choices[0].finish_reason == "stop" and stop not in (cut.choices[0].message.content or "")


def test_logprobs_in_openai_shape(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=4, logprobs=True, top_logprobs=3, temperature=0
    )
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None and len(lp.content) == 4
    for item in lp.content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert item.top_logprobs[0].logprob >= item.top_logprobs[-1].logprob
        assert item.bytes is not None
    # greedy: the chosen token is the most likely one
    assert lp.content[0].token == lp.content[0].top_logprobs[0].token


def test_json_schema_response_format_is_enforced(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=USER,
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
    )
    content = r.choices[0].message.content or ""
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content)["ok"], bool)
    else:
        assert content.lstrip().startswith("{")


def test_embeddings(client: openai.OpenAI, http: httpx.Client) -> None:
    r = client.embeddings.create(model=MODEL, input=["a red apple", "a green pear"])  # client asks base64
    assert len(r.data) == 2 and r.usage.prompt_tokens > 0
    norms = [math.sqrt(sum(v * v for v in d.embedding)) for d in r.data]
    assert all(abs(n - 1.0) < 1e-3 for n in norms)
    raw = http.post("/v1/embeddings", json={"input": "a red apple", "encoding_format": "float"}).json()
    assert raw["object"] == "list" and raw["data"][0]["object"] == "embedding"
    assert raw["data"][0]["embedding"] == pytest.approx(r.data[0].embedding, abs=1e-5)


def test_tokenize_detokenize_apply_template(http: httpx.Client) -> None:
    tokens = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert http.post("/detokenize", json={"tokens": tokens}).json()["content"] == "Hello world"
    pieces = http.post("/tokenize", json={"content": "Hello", "with_pieces": True}).json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == "Hello"
    prompt = http.post("/apply-template", json={"messages": USER}).json()["prompt"]
    assert "what color is an apple?" in prompt


def test_health_and_metrics(server: Server, http: httpx.Client) -> None:
    h = http.get("/health")
    assert h.status_code == 200
    body = h.json()
    budget = body.pop("prefill_budget")
    assert body == {
        "status": "ok",
        "model": "tiny-f16",
        "slots_total": 4,
        "slots_busy": 0,
        "queue_depth": 0,
    }
    # the step's prompt-token budget chosen at start (auto): at least the floor, at most n_batch
    assert isinstance(budget, int) and 64 <= budget <= 512
    text = http.get("/metrics").text
    for name in (
        "outpost_time_to_first_token_seconds_bucket",
        "outpost_inter_token_latency_seconds_bucket",
        "outpost_e2e_request_latency_seconds_bucket",
        "outpost_queue_time_seconds_bucket",
        "outpost_requests_total{",
        "outpost_prompt_tokens_total",
        "outpost_generation_tokens_total",
        "outpost_prefix_cache_reused_tokens_total",
        "outpost_slots_busy",
        "outpost_queue_depth",
        "outpost_kv_cells_used",
    ):
        assert name in text, name
    assert 'endpoint="/v1/chat/completions",status="200"' in text
    assert server.metric("outpost_generation_tokens_total") > 0


def test_sagemaker_ping_and_invocations(http: httpx.Client) -> None:
    assert http.get("/ping").status_code == 200
    tgi = http.post("/invocations", json={"inputs": "The sky is", "parameters": {"max_new_tokens": 6}})
    assert tgi.status_code == 200, tgi.text
    body = tgi.json()
    assert isinstance(body, list) and isinstance(body[0]["generated_text"], str) and body[0]["generated_text"]
    full = http.post(
        "/invocations",
        json={"inputs": "The sky is", "parameters": {"max_new_tokens": 6, "return_full_text": True}},
    )
    assert full.json()[0]["generated_text"] == "The sky is" + body[0]["generated_text"]  # greedy: same text
    chat = http.post("/invocations", json={"messages": USER, "max_tokens": 5})
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"


def test_curl_style_form_content_type_is_read_as_json(http: httpx.Client) -> None:
    body = json.dumps({"messages": USER, "max_tokens": 3})
    r = http.post(
        "/v1/chat/completions", content=body, headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 200, r.text


LONG = "apple " * 5000

BAD_INPUT: list[tuple[str, str, Any, int, str | None]] = [
    ("malformed json", "/v1/chat/completions", b'{"messages": [', 400, None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("messages wrong type", "/v1/chat/completions", {"messages": "hello"}, 400, None),
    ("max_tokens wrong type", "/v1/chat/completions", {"messages": USER, "max_tokens": "many"}, 400, None),
    ("temperature wrong type", "/v1/chat/completions", {"messages": USER, "temperature": "hot"}, 400, None),
    ("missing messages", "/v1/chat/completions", {"model": "tiny-f16"}, 400, None),
    ("empty messages", "/v1/chat/completions", {"messages": []}, 400, None),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    (
        "image part",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        None,
    ),
    ("n=17", "/v1/chat/completions", {"messages": USER, "n": 17}, 400, None),
    ("bad grammar", "/v1/chat/completions", {"messages": USER, "grammar": "root ::= x"}, 400, None),
    (
        "max_tokens over ctx",
        "/v1/chat/completions",
        {"messages": USER, "max_tokens": 100000},
        400,
        "context_length_exceeded",
    ),
    (
        "prompt over ctx",
        "/v1/completions",
        {"prompt": "apple " * 4500, "max_tokens": 4},
        400,
        "context_length_exceeded",
    ),
    (
        "invalid json_schema",
        "/v1/chat/completions",
        {
            "messages": USER,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            },
        },
        400,
        None,
    ),
    ("logit_bias bad key", "/v1/chat/completions", {"messages": USER, "logit_bias": {"abc": 1}}, 400, None),
    (
        "logit_bias out of vocab",
        "/v1/chat/completions",
        {"messages": USER, "logit_bias": {"99999999": 1}},
        400,
        None,
    ),
    ("stop too many", "/v1/chat/completions", {"messages": USER, "stop": ["x"] * 17}, 400, None),
    ("top_p out of range", "/v1/chat/completions", {"messages": USER, "top_p": 7}, 400, None),
    (
        "body too large",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONG * 3}]},
        413,
        None,
    ),
    ("tokenize wrong type", "/tokenize", {"content": 5}, 400, None),
    ("detokenize bad id", "/detokenize", {"tokens": [-1]}, 400, None),
    ("invocations unknown body", "/invocations", {"foo": 1}, 400, None),
    (
        "invocations bad parameters",
        "/invocations",
        {"inputs": "x", "parameters": {"max_new_tokens": "x"}},
        400,
        None,
    ),
    ("embeddings empty list", "/v1/embeddings", {"input": []}, 400, None),
    ("completions empty prompt list", "/v1/completions", {"prompt": []}, 400, None),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "code"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_gets_an_openai_error(
    http: httpx.Client, path: str, body: Any, status: int, code: str | None
) -> None:
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert_openai_error(r, status, code)


def test_unknown_paths_and_methods_are_openai_errors(http: httpx.Client) -> None:
    assert_openai_error(http.get("/v1/nothing"), 404)
    assert_openai_error(http.get("/v1/chat/completions"), 405)
    assert_openai_error(http.get("/v1/models/gpt-9"), 404, "model_not_found")


async def _stream_tokens(url: str, i: int) -> tuple[int, bool]:
    body = {
        "messages": [{"role": "user", "content": f"story number {i}"}],
        "max_tokens": 24,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        httpx.AsyncClient(base_url=url, timeout=120) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        assert r.status_code == 200
        events = sse_events([line async for line in r.aiter_lines()])
    usage = events[-2]["usage"]["completion_tokens"]
    return usage, events[-1] == "[DONE]"


def test_sixteen_concurrent_streams_all_complete(server: Server) -> None:
    async def main() -> list[tuple[int, bool]]:
        return await asyncio.wait_for(
            asyncio.gather(*(_stream_tokens(server.url, i) for i in range(16))), 120
        )

    results = asyncio.run(main())
    assert results == [(24, True)] * 16
    server.wait_idle(5.0)


def test_request_log_is_json_without_prompts(server: Server) -> None:
    lines = [json.loads(line) for line in server.stderr().splitlines() if line.startswith("{")]
    chat = [entry for entry in lines if entry["path"] == "/v1/chat/completions" and entry["status"] == 200]
    assert chat and all(
        e["id"].startswith("chatcmpl-") and "timings" in e and "completion_tokens" in e for e in chat
    )
    assert not any("prompt" in e or "completion" in e for e in lines)
    assert "what color is an apple" not in server.stderr()
