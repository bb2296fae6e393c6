"""Tool calls are never lost: an answer cut at max_tokens inside its third call keeps the two it
finished, driven by the `openai` client (plain and streamed) over a scripted fake backend.

The FakeBackend's reply is what SmolLM2 does under `tool_choice: "required"` with parallel calls
allowed: it repeats the call until the token limit cuts one in the middle.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import openai
import pytest
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.settings import HttpSettings

CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def ask(reply: str, stream: bool, **extra: Any) -> Any:
    backend = FakeBackend(reply, n_ctx_seq=4096)

    async def main() -> Any:
        app = create_app({"m": backend}, HttpSettings(), "m")
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test/v1")
        client = openai.AsyncOpenAI(api_key="x", base_url="http://test/v1", http_client=http)
        kwargs: dict[str, Any] = {
            "model": "m",
            "messages": [{"role": "user", "content": "weather?"}],
            "tools": TOOLS,
            "tool_choice": "required",
            **extra,
        }
        async with http:
            if not stream:
                return (await client.chat.completions.create(**kwargs)).model_dump()
            chunks = [
                c.model_dump() async for c in await client.chat.completions.create(**kwargs, stream=True)
            ]
            return chunks

    return asyncio.run(main())


@pytest.mark.parametrize("wrap", ["array", "blocks"])
def test_complete_calls_survive_the_length_limit(wrap: str) -> None:
    if wrap == "array":
        reply = f"[{CALL}, {CALL}, " + CALL
    else:
        reply = f"<tool_call>\n{CALL}\n</tool_call>\n" * 2 + f"<tool_call>\n{CALL}"
    cut = len(reply) - 12  # inside the third call's arguments
    res = ask(reply, stream=False, max_tokens=cut)
    choice = res["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}] * 2
    assert choice["finish_reason"] == "tool_calls" and choice["truncated_tool_call"] is True
    assert not choice["message"]["content"]


def test_streamed_calls_survive_the_length_limit() -> None:
    reply = f"[{CALL}, {CALL}, " + CALL
    chunks = ask(reply, stream=True, max_tokens=len(reply) - 12)
    deltas = [d for c in chunks for d in (c["choices"][0]["delta"]["tool_calls"] or []) if c["choices"]]
    assert sorted({d["index"] for d in deltas}) == [0, 1]
    args = ["".join(d["function"]["arguments"] or "" for d in deltas if d["index"] == i) for i in (0, 1)]
    assert [json.loads(a) for a in args] == [{"city": "Paris"}] * 2
    last = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]][-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and last["truncated_tool_call"] is True


def test_a_complete_answer_is_not_marked_and_a_cut_first_call_stays_content() -> None:
    whole = ask(f"[{CALL}, {CALL}]", stream=False, max_tokens=200)["choices"][0]
    assert len(whole["message"]["tool_calls"]) == 2 and "truncated_tool_call" not in whole
    assert whole["finish_reason"] == "tool_calls"
    cut = ask(f"[{CALL}", stream=False, max_tokens=20)["choices"][0]
    assert cut["message"]["tool_calls"] is None and cut["finish_reason"] == "length"
    assert cut["message"]["content"] == f"[{CALL}"[:20]
