"""The Responses and Anthropic Messages APIs over an in-memory backend, driven by the real `openai`
and `anthropic` clients in process (ASGI): scripted answers show how reasoning, text and tool calls
become items and blocks, and what each follow-up's prompt holds (FakeCodec renders `role: text`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anthropic
import httpx2
import openai
import pytest
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.api.responses.store import ResponseStore
from outpost.messages import QueueFull
from outpost.settings import HttpSettings

T = TypeVar("T")
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
R_TOOLS: list[Any] = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
A_TOOLS: list[Any] = [{"name": "get_weather", "input_schema": WEATHER}]


@pytest.fixture()
def config() -> HttpSettings:
    return HttpSettings()


def run(
    backend: FakeBackend,
    config: HttpSettings,
    go: Callable[[openai.AsyncOpenAI, anthropic.AsyncAnthropic], Awaitable[T]],
    more: dict[str, FakeBackend] | None = None,
) -> T:
    """`more`: other models beside "m" (a gateway of several; one model takes any name)."""

    async def main() -> T:
        app = create_app({"m": backend, **(more or {})}, config, "m")
        http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test")
        oa = openai.AsyncOpenAI(base_url="http://test/v1", api_key="k", http_client=http, max_retries=0)
        an = anthropic.AsyncAnthropic(base_url="http://test", api_key="k", http_client=http, max_retries=0)
        async with http:
            return await go(oa, an)

    return asyncio.run(main())


def prompt_of(backend: FakeBackend, i: int = -1) -> str:
    return "".join(chr(t) for t in backend.submitted[i].prompt_tokens)


def test_responses_reasoning_and_text_whole_and_streamed(config: HttpSettings) -> None:
    backend = FakeBackend("<think>Two and two.</think>It is **4**.")

    async def go(oa: openai.AsyncOpenAI, _: Any) -> Any:
        whole = await oa.responses.create(model="m", input="2+2?", instructions="Be exact.")
        kinds = []
        async with oa.responses.stream(model="m", input="2+2?") as stream:
            async for event in stream:
                kinds.append(event.type)
            final = await stream.get_final_response()
        return whole, kinds, final

    whole, kinds, final = run(backend, config, go)
    assert [i.type for i in whole.output] == ["reasoning", "message"]
    assert whole.output[0].content[0].text == "Two and two."
    assert whole.output_text == final.output_text == "It is **4**."
    assert whole.usage.output_tokens == len(backend.reply) and whole.usage.input_tokens > 0
    assert prompt_of(backend, 0).startswith("system: Be exact.\nuser: 2+2?\n")
    assert final.output[0].content[0].text == "Two and two." and final.status == "completed"
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert "response.reasoning_text.delta" in kinds and "response.output_text.delta" in kinds
    assert kinds[-1] == "response.completed"


def test_an_empty_streamed_answer_opens_and_closes_its_one_message(config: HttpSettings) -> None:
    """An answer of no text is still one message item: added, then done, in sequence."""
    backend = FakeBackend("")

    async def go(oa: openai.AsyncOpenAI, _: Any) -> Any:
        async with oa.responses.stream(model="m", input="Say nothing.") as stream:
            events = [event async for event in stream]
            return events, await stream.get_final_response()

    events, final = run(backend, config, go)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    (message,) = final.output
    assert message.type == "message" and final.output_text == ""


def test_responses_function_call_then_output_by_previous_response_id(config: HttpSettings) -> None:
    backend = FakeBackend(CALL, n_ctx_seq=4096)

    async def go(oa: openai.AsyncOpenAI, _: Any) -> Any:
        first = await oa.responses.create(model="m", input="Weather in Oslo?", tools=R_TOOLS)
        async with oa.responses.stream(model="m", input="Weather in Oslo?", tools=R_TOOLS) as stream:
            streamed = await stream.get_final_response()
        backend.reply = "Sunny."
        call = first.output[0]
        result: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
        follow = await oa.responses.create(
            model="m", previous_response_id=first.id, input=[result], tools=R_TOOLS
        )
        got = await oa.responses.retrieve(follow.id)
        await oa.responses.delete(follow.id)
        with pytest.raises(openai.NotFoundError):
            await oa.responses.retrieve(follow.id)
        return first, streamed, follow, got

    first, streamed, follow, got = run(backend, config, go)
    for r in (first, streamed):
        (call,) = r.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Oslo", "days": 2}
    assert follow.output_text == got.output_text == "Sunny."
    prompt = prompt_of(backend)
    assert "user: Weather in Oslo?" in prompt and '"city": "Oslo"' in prompt
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in prompt


def test_responses_json_schema_and_unserved_inputs(config: HttpSettings) -> None:
    backend = FakeBackend('{"city": "Oslo"}')

    async def go(oa: openai.AsyncOpenAI, _: Any) -> list[str]:
        fmt: Any = {"format": {"type": "json_schema", "name": "w", "schema": WEATHER}}
        await oa.responses.create(model="m", input="json please", text=fmt)
        errors = []
        bad: list[Any] = [
            {"input": "hi", "previous_response_id": "resp_gone"},
            {"input": "hi", "tools": [{"type": "web_search"}]},
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            {"input": "hi", "store": False},
        ]
        for body in bad:
            try:
                r = await oa.responses.create(model="m", **body)
                await oa.responses.create(model="m", input="again", previous_response_id=r.id)
            except openai.BadRequestError as exc:
                errors.append(f"{exc.code} {exc}")
        return errors

    errors = run(backend, config, go)
    assert backend.submitted[0].sampling.grammar is not None  # text.format enforced by a grammar
    assert "resp_gone" in errors[0] and "previous_response_not_found" in errors[0]
    assert "web_search" in errors[1] and "input_image" in errors[2]
    assert "is not stored here" in errors[3]  # store: false keeps nothing


def test_response_store_is_bounded_by_count_and_age() -> None:
    now = [0.0]
    store = ResponseStore(max_items=2, ttl=10.0, clock=lambda: now[0])
    for rid in ("a", "b", "c"):
        store.put(rid, {"id": rid}, [])
    assert store.get("a") is None and len(store) == 2  # the least recently used went first
    assert store.get("b") is not None
    store.put("d", {"id": "d"}, [])
    assert store.get("c") is None and store.get("b") is not None  # b was used after c
    now[0] = 10.0
    assert store.get("b") is None and store.get("d") is None and len(store) == 0


def test_anthropic_thinking_text_and_stream(config: HttpSettings) -> None:
    backend = FakeBackend("<think>Hmm.</think>Hello there")

    async def go(_: Any, an: anthropic.AsyncAnthropic) -> Any:
        system: Any = [{"type": "text", "text": "Be kind."}]
        kwargs: Any = dict(
            model="m", max_tokens=64, system=system, messages=[{"role": "user", "content": "hi"}]
        )
        msg = await an.messages.create(**kwargs)
        deltas = []
        async with an.messages.stream(**kwargs) as stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    deltas.append(event.delta.type)
            final = await stream.get_final_message()
        counted = await an.messages.count_tokens(model="m", system=system, messages=kwargs["messages"])
        return msg, deltas, final, counted

    msg, deltas, final, counted = run(backend, config, go)
    for m in (msg, final):
        assert [b.type for b in m.content] == ["thinking", "text"]
        assert m.content[0].thinking == "Hmm." and m.content[1].text == "Hello there"
        assert m.stop_reason == "end_turn" and m.usage.output_tokens == len(backend.reply)
    assert {"thinking_delta", "text_delta"} <= set(deltas)
    assert prompt_of(backend, 0) == "system: Be kind.\nuser: hi\nassistant: "
    assert counted.input_tokens == msg.usage.input_tokens == len(prompt_of(backend, 0))


def test_anthropic_usage_counts_cached_tokens_apart_from_input_tokens(config: HttpSettings) -> None:
    """Anthropic's input_tokens are the prompt tokens read afresh; with cache_read_input_tokens they
    make the prompt, whole and streamed."""
    backend = FakeBackend("Hi")
    backend.cached = 5

    async def go(_: Any, an: anthropic.AsyncAnthropic) -> Any:
        kwargs: Any = dict(model="m", max_tokens=8, messages=[{"role": "user", "content": "hello"}])
        msg = await an.messages.create(**kwargs)
        async with an.messages.stream(**kwargs) as stream:
            final = await stream.get_final_message()
        return msg, final

    msg, final = run(backend, config, go)
    prompt = len(prompt_of(backend, 0))
    for m in (msg, final):
        assert m.usage.cache_read_input_tokens == 5
        assert m.usage.input_tokens == prompt - 5


def test_anthropic_tool_use_then_tool_result(config: HttpSettings) -> None:
    backend = FakeBackend(CALL, n_ctx_seq=4096)

    async def go(_: Any, an: anthropic.AsyncAnthropic) -> Any:
        messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
        first = await an.messages.create(model="m", max_tokens=200, messages=messages, tools=A_TOOLS)
        async with an.messages.stream(model="m", max_tokens=200, messages=messages, tools=A_TOOLS) as s:
            streamed = await s.get_final_message()
        backend.reply = "Sunny."
        use = first.content[0]
        messages.append({"role": "assistant", "content": [use.model_dump()]})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text", "text": "21 C"}]}
        messages.append({"role": "user", "content": [result]})
        answer = await an.messages.create(model="m", max_tokens=200, messages=messages, tools=A_TOOLS)
        return first, streamed, answer

    first, streamed, answer = run(backend, config, go)
    for m in (first, streamed):
        (use,) = m.content
        assert m.stop_reason == "tool_use" and use.type == "tool_use"
        assert use.name == "get_weather" and use.input == {"city": "Oslo", "days": 2}
    assert answer.content[0].text == "Sunny." and answer.stop_reason == "end_turn"
    assert "<tool_response>\n21 C\n</tool_response>" in prompt_of(backend)


def test_anthropic_errors_are_in_anthropics_envelope(config: HttpSettings) -> None:
    backend = FakeBackend("x")

    async def go(_: Any, an: anthropic.AsyncAnthropic) -> list[Any]:
        hi: Any = [{"role": "user", "content": "hi"}]
        caught = []
        for kwargs in (
            {"model": "other", "max_tokens": 4, "messages": hi},
            {"model": "m", "max_tokens": 0, "messages": hi},
            {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
            {"model": "m", "max_tokens": 4, "messages": hi, "tools": [{"type": "web_search_20250305"}]},
        ):
            try:
                await an.messages.create(**kwargs)
            except anthropic.APIStatusError as exc:
                caught.append(exc)
        backend.refuse = QueueFull("busy")
        try:
            await an.messages.create(model="m", max_tokens=4, messages=hi)
        except anthropic.RateLimitError as exc:
            caught.append(exc)
        return caught

    caught = run(backend, config, go, more={"n": FakeBackend()})  # two models: "other" is a 404
    statuses = [(e.status_code, e.body["error"]["type"]) for e in caught]
    assert statuses == [
        (404, "not_found_error"),
        (400, "invalid_request_error"),
        (400, "invalid_request_error"),
        (400, "invalid_request_error"),
        (429, "rate_limit_error"),
    ]
    assert all(e.body["type"] == "error" and e.body["error"]["message"] for e in caught)
    assert "max_tokens" in caught[1].body["error"]["message"]
