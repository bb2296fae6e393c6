"""Tool calling and structured output through a real `outpost serve` and the real `openai` client.

The synthetic model knows nothing of tools, so these runs show the grammar doing the work:
`required` and named-function calls must validate against the tools' JSON schemas (jsonschema)
for every seed, integer bounds included. One server uses the model's own template (no tool
section: the generic system-prompt injection), the other Qwen 2.5's template given with
--chat-template (the native `<tool_call>` format), for the agent loop through the template.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from server_harness import Server, assert_openai_error, start

QWEN_TEMPLATE = Path(__file__).parent.parent / "data" / "qwen2.5-tools.jinja"
SEEDS = range(20)
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "days"],
}
ADD_ARGS = {
    "type": "object",
    "properties": {
        "numbers": {
            "type": "array",
            "items": {"type": "integer", "minimum": -50, "maximum": 50},
            "minItems": 2,
            "maxItems": 3,
        },
    },
    "required": ["numbers"],
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Weather forecast", "parameters": WEATHER_ARGS},
    },
    {"type": "function", "function": {"name": "add", "description": "Add numbers", "parameters": ADD_ARGS}},
]
SCHEMAS = {"get_weather": WEATHER_ARGS, "add": ADD_ARGS}
USER: list[Any] = [{"role": "user", "content": "What is the weather in Oslo this week?"}]


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, "-np", "2", "-c", "4096", "--default-max-tokens", "16") as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def qwen(tiny_model: Path) -> Iterator[Server]:
    args = ("-np", "1", "-c", "4096", "--default-max-tokens", "16", "--chat-template", str(QWEN_TEMPLATE))
    with start(tiny_model, *args) as srv:
        yield srv


def _check_calls(calls: Any, names: set[str]) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def _per_seed(client: openai.OpenAI, **kwargs: Any) -> list[Any]:
    """One completion per seed, two at a time (the server has two slots)."""

    def one(seed: int) -> Any:
        return client.chat.completions.create(model="tiny-f16", messages=USER, seed=seed, **kwargs)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, SEEDS))


def test_response_format_numeric_bounds_hold_for_every_seed(client: openai.OpenAI) -> None:
    props = {
        "n": {"type": "integer", "maximum": 7},
        "k": {"type": "integer", "minimum": 1, "maximum": 7},
        "x": {"type": "number", "minimum": -2.5, "maximum": 1.5},
    }
    schema = {"type": "object", "properties": props, "required": ["n", "k", "x"]}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "nkx", "schema": schema}}
    for r in _per_seed(client, response_format=fmt, max_tokens=120, temperature=1.5):
        assert r.choices[0].finish_reason == "stop", r
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), schema)


def test_required_calls_validate_for_every_seed(client: openai.OpenAI) -> None:
    replies = _per_seed(
        client,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=120,
        temperature=1.0,
    )
    for r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None
        _check_calls(choice.message.tool_calls, {"get_weather", "add"})
        assert len(choice.message.tool_calls or []) == 1


def test_named_function_calls_validate_for_every_seed(client: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "add"}}
    for r in _per_seed(client, tools=TOOLS, tool_choice=named, max_tokens=120, temperature=1.0):
        choice = r.choices[0]
        assert choice.finish_reason == "stop"  # OpenAI's finish for a forced function
        _check_calls(choice.message.tool_calls, {"add"})


def test_parallel_required_calls_stream_and_are_assembled_by_the_client(client: openai.OpenAI) -> None:
    for seed in range(2):
        kwargs: Any = dict(
            model="tiny-f16",
            messages=USER,
            tools=TOOLS,
            tool_choice="required",
            seed=seed,
            max_tokens=1500,
            temperature=1.0,
        )
        whole = client.chat.completions.create(**kwargs)
        with client.chat.completions.stream(**kwargs) as stream:
            final = stream.get_final_completion()
        streamed = final.choices[0]
        assert streamed.finish_reason == "tool_calls"
        _check_calls(streamed.message.tool_calls, {"get_weather", "add"})
        # same seed, same calls: the stream's pieces join to the non-streamed arguments
        got = [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls or []]
        want = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls or []]
        assert got == want


def test_stream_chunks_carry_index_id_name_then_argument_pieces(server: Server) -> None:
    body = {
        "messages": USER,
        "tools": TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "seed": 3,
        "max_tokens": 120,
        "stream": True,
    }
    with server.client() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    parts = [tc for e in events for c in e["choices"] for tc in (c["delta"].get("tool_calls") or [])]
    assert parts[0]["id"].startswith("call_") and parts[0]["function"]["arguments"] == ""
    assert parts[0]["type"] == "function" and parts[0]["function"]["name"]
    assert len(parts) >= 3 and all(p["index"] == 0 and "id" not in p for p in parts[1:])
    args = "".join(p["function"]["arguments"] for p in parts)
    jsonschema.validate(json.loads(args), SCHEMAS[parts[0]["function"]["name"]])
    assert [c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]] == ["tool_calls"]


@pytest.mark.parametrize("which", ["server", "qwen"])
def test_agent_loop_through_the_chat_template(which: str, request: pytest.FixtureRequest) -> None:
    srv: Server = request.getfixturevalue(which)
    client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages: list[Any] = list(USER)
    first = client.chat.completions.create(
        model="tiny-f16",
        messages=messages,
        tools=TOOLS,
        seed=1,
        max_tokens=120,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny, 21 C"}'})
    answer = client.chat.completions.create(
        model="tiny-f16", messages=messages, tools=TOOLS, max_tokens=8, seed=1
    )
    choice = answer.choices[0]
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    # the template saw the call and its result: the prompt the server rendered holds both
    with srv.client() as http:
        prompt = http.post("/apply-template", json={"messages": messages, "tools": TOOLS}).json()["prompt"]
        n_prompt = len(http.post("/tokenize", json={"content": prompt}).json()["tokens"])
    args = json.loads(call.function.arguments)
    assert f'"name": "get_weather", "arguments": {json.dumps(args, ensure_ascii=False)}' in prompt
    assert '<tool_response>\n{"forecast": "sunny, 21 C"}\n</tool_response>' in prompt
    assert ("# Tools" in prompt) == (which == "qwen") and ("You can call these tools" in prompt) == (
        which == "server"
    )
    assert answer.usage is not None and abs(answer.usage.prompt_tokens - n_prompt) <= 1  # BOS


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"x": {"type": "bogus"}}},
                        },
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {"messages": [*USER, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]},
            "messages.1.tool_call_id",
        ),
    ],
)
def test_bad_tool_input_is_an_openai_400(server: Server, body: dict[str, Any], param: str) -> None:
    with server.client() as http:
        r = http.post("/v1/chat/completions", json={"messages": USER, **body})
    assert assert_openai_error(r, 400)["param"] == param


def test_auto_leaves_plain_answers_plain(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model="tiny-f16", messages=USER, tools=TOOLS, max_tokens=8, seed=2)
    choice = r.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert isinstance(choice.message.content, str)


def test_reasoning_content_split_from_a_template_that_opens_think(tiny_model: Path, tmp_path: Path) -> None:
    """A template ending in `<think>` (as R1 distills do): the output starts inside the thinking."""
    template = tmp_path / "r1.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}\n{% endfor %}<think>\n")
    with start(tiny_model, "-np", "1", "-c", "2048", "--chat-template", str(template)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)
        r = client.chat.completions.create(
            model="tiny-f16", messages=USER, max_tokens=10, seed=0, extra_body={"ignore_eos": True}
        )
        extra = r.choices[0].message.model_extra or {}
        assert extra.get("reasoning_content") and not r.choices[0].message.content  # never closed
        chunks = list(
            client.chat.completions.create(
                model="tiny-f16",
                messages=USER,
                max_tokens=10,
                seed=0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
        )
        streamed = "".join(
            (c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks if c.choices
        )
        assert streamed == extra["reasoning_content"]
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            inline = http.post(
                "/v1/chat/completions",
                json={
                    "messages": USER,
                    "max_tokens": 10,
                    "seed": 0,
                    "ignore_eos": True,
                    "reasoning_format": "none",
                },
            ).json()
        assert inline["choices"][0]["message"]["content"] == extra["reasoning_content"]
        assert "reasoning_content" not in inline["choices"][0]["message"]
