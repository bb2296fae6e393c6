"""What a user of the Responses API, the Anthropic Messages API and the OpenAI Agents SDK does,
as checks over a base URL: the same checks run against `outpost serve` and through a gateway.

They hold on any model, the synthetic one included: answers are read for their shape (usage,
stop reasons, items, blocks) and tool calls are forced (`required` / `any`), so the grammar makes
them valid whatever the weights say; greedy decoding makes a repeat give the same text.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import anthropic
import jsonschema
import openai
import pydantic
from e2e.server_harness import TIMEOUT_SCALE

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER}
]
ANTHROPIC_TOOLS: list[Any] = [
    {"name": "get_weather", "description": "Weather forecast", "input_schema": WEATHER}
]
ASK = "What is the weather in Oslo this week?"
GREEDY: Any = {"temperature": 0}  # anthropic 2.x has no sampling arguments; the API still takes them


def most_tokens(longest: object) -> int:
    """More tokens than an answer constrained to a JSON schema can take, its end of turn included, on
    any weights and any CPU: `longest` is the schema's longest value written compactly (each string at
    its maxLength, each integer at its widest). The schema's grammar (outpost/grammar) admits at most
    one optional space after each byte of that compact form, a string's character is at most 6 bytes
    (a \\uXXXX escape), and every token the grammar lets through is at least one byte: so at most 2
    bytes per compact byte, a token each, then the end of turn."""
    compact = json.dumps(longest, separators=(",", ":"))  # "\0" is written "\\u0000": 6 bytes
    return 2 * len(compact.encode()) + 1


# One forced get_weather call (parallel calls off), at its longest: the limit that lets it end.
CALL_TOKENS = most_tokens({"name": "get_weather", "arguments": {"city": "\0" * 12, "days": 7}})


def _prompt(usage: Any) -> int:
    """Anthropic's prompt size: the tokens read afresh and those read from the cache."""
    return int(usage.input_tokens + (usage.cache_read_input_tokens or 0))


def openai_client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120 * TIMEOUT_SCALE)


def anthropic_client(url: str, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=120 * TIMEOUT_SCALE)


# ---- the Responses API ----


def responses_create_and_stream(url: str, model: str) -> None:
    client = openai_client(url)
    kwargs: Any = dict(model=model, input=ASK, instructions="Be brief.", max_output_tokens=12, temperature=0)
    whole = client.responses.create(**kwargs)
    assert whole.status in ("completed", "incomplete") and whole.object == "response"
    assert whole.output[-1].type == "message" and whole.output_text
    use = whole.usage
    assert (
        use is not None and use.input_tokens > 0 and use.total_tokens == use.input_tokens + use.output_tokens
    )
    assert use.output_tokens == 12 if whole.status == "incomplete" else use.output_tokens <= 12
    with client.responses.stream(**kwargs) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    # the last event has the whole response (the SDK's get_final_response wants a `completed` one,
    # and a cut answer ends `incomplete`, as OpenAI's do)
    final = events[-1].response  # type: ignore[union-attr]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}" and "response.output_text.delta" in kinds
    assert final.output_text == whole.output_text  # greedy: the stream joins to the same answer
    assert final.usage is not None and final.usage.input_tokens == use.input_tokens
    assert client.responses.retrieve(final.id).output_text == final.output_text


def responses_tools_then_output(url: str, model: str) -> None:
    client = openai_client(url)
    # One call (parallel calls off) in CALL_TOKENS: it completes on any weights; up to 8 parallel calls
    # of a sampled answer could outrun any small limit.
    forced: Any = {
        "input": ASK,
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "max_output_tokens": CALL_TOKENS,
    }
    first = client.responses.create(model=model, **forced)
    calls = [item for item in first.output if item.type == "function_call"]
    assert calls and first.status == "completed", first
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    with client.responses.stream(model=model, **forced, temperature=0) as stream:
        events = [e.type for e in stream]
        streamed = stream.get_final_response()
    assert (
        "response.function_call_arguments.delta" in events
        and "response.function_call_arguments.done" in events
    )
    streamed_calls = [i for i in streamed.output if i.type == "function_call"]
    jsonschema.validate(json.loads(streamed_calls[0].arguments), WEATHER)
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"forecast": "sunny"}'}
    follow = client.responses.create(
        model=model, previous_response_id=first.id, input=[result], tools=RESPONSES_TOOLS, max_output_tokens=8
    )
    assert follow.previous_response_id == first.id and follow.output[-1].type == "message"
    # the follow-up's prompt holds the first turn, the call and its output
    assert follow.usage is not None and first.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens
    # All of the first answer's items (the call and any text around it): the stored turn has them all.
    items = [item.model_dump(exclude_none=True) for item in first.output]
    history: list[Any] = [{"role": "user", "content": ASK}, *items, result]
    resent = client.responses.create(model=model, input=history, tools=RESPONSES_TOOLS, max_output_tokens=8)
    assert resent.usage is not None and resent.usage.input_tokens == follow.usage.input_tokens


def responses_json_schema(url: str, model: str) -> None:
    client = openai_client(url)
    text: Any = {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER, "strict": True}}
    # sampled (temperature 1): the bound, not the weights, lets it complete
    bound = most_tokens({"city": "\0" * 12, "days": 7})
    r = client.responses.create(model=model, input=ASK, text=text, max_output_tokens=bound, temperature=1.0)
    assert r.status == "completed", r
    jsonschema.validate(json.loads(r.output_text), WEATHER)


def responses_errors(url: str, model: str) -> None:
    client = openai_client(url)
    try:
        client.responses.create(model=model, input="hi", previous_response_id="resp_nowhere")
        raise AssertionError("an unknown previous_response_id was accepted")
    except openai.BadRequestError as exc:
        assert "resp_nowhere" in str(exc) and exc.code == "previous_response_not_found"
    try:
        client.responses.create(model=model, input="hi", tools=[{"type": "web_search"}])
        raise AssertionError("a hosted tool was accepted")
    except openai.BadRequestError as exc:
        assert "web_search" in str(exc)


# ---- the Anthropic Messages API ----


def anthropic_create_stream_count(url: str, model: str) -> None:
    client = anthropic_client(url)
    messages: Any = [{"role": "user", "content": ASK}]
    kwargs: Any = dict(model=model, max_tokens=10, messages=messages, system="Be brief.", extra_body=GREEDY)
    msg = client.messages.create(**kwargs)
    assert msg.type == "message" and msg.role == "assistant" and msg.content[0].type == "text"
    assert msg.stop_reason in ("end_turn", "max_tokens")
    assert msg.usage.output_tokens <= 10 and msg.usage.input_tokens > 0
    with client.messages.stream(**kwargs) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == msg.content[0].text  # type: ignore[union-attr]
    # The prompt is input_tokens (read afresh) + cache_read_input_tokens (the stream's mostly cached).
    assert final.stop_reason == msg.stop_reason and _prompt(final.usage) == _prompt(msg.usage)
    counted = client.messages.count_tokens(model=model, messages=messages, system="Be brief.")
    assert counted.input_tokens == _prompt(msg.usage)


def anthropic_stop_reasons(url: str, model: str) -> None:
    client = anthropic_client(url)
    messages: Any = [{"role": "user", "content": "Count: one two three"}]
    long = client.messages.create(model=model, max_tokens=6, messages=messages, extra_body=GREEDY)
    assert long.stop_reason == "max_tokens" and long.usage.output_tokens == 6
    text = long.content[0].text  # type: ignore[union-attr]
    stop = text.strip()[-2:] if len(text.strip()) >= 3 else None
    if stop is None:
        return  # the weights ended the answer at once: nothing to stop on
    cut = client.messages.create(
        model=model, max_tokens=6, messages=messages, extra_body=GREEDY, stop_sequences=[stop]
    )
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop, cut
    assert stop not in cut.content[0].text  # type: ignore[union-attr]


def anthropic_tools(url: str, model: str) -> None:
    client = anthropic_client(url)
    messages: list[Any] = [{"role": "user", "content": ASK}]
    one: Any = {"type": "any", "disable_parallel_tool_use": True}  # one call, in CALL_TOKENS on any weights
    first = client.messages.create(
        model=model, max_tokens=CALL_TOKENS, messages=messages, tools=ANTHROPIC_TOOLS, tool_choice=one
    )
    uses = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and uses, first
    jsonschema.validate(uses[0].input, WEATHER)
    with client.messages.stream(
        model=model, max_tokens=CALL_TOKENS, messages=messages, tools=ANTHROPIC_TOOLS, tool_choice=one
    ) as stream:
        kinds = {e.delta.type for e in stream if e.type == "content_block_delta"}
        streamed = stream.get_final_message()
    assert "input_json_delta" in kinds and streamed.stop_reason == "tool_use"
    jsonschema.validate(next(b for b in streamed.content if b.type == "tool_use").input, WEATHER)
    messages.append(
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]}
    )
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": '{"forecast": "sunny"}'}
    messages.append({"role": "user", "content": [result]})
    answer = client.messages.create(model=model, max_tokens=8, messages=messages, tools=ANTHROPIC_TOOLS)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert _prompt(answer.usage) > _prompt(first.usage)


def anthropic_errors(url: str, model: str) -> None:
    client = anthropic_client(url)
    # One model served takes any name (llama-server's rule); the 404 envelope of a server with
    # several: tests/unit/test_agent_apis.py.
    other = client.messages.create(
        model="claude-haiku-4-5", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert other.model == model
    try:
        client.messages.create(model=model, max_tokens=0, messages=[{"role": "user", "content": "hi"}])
        raise AssertionError("max_tokens=0 was accepted")
    except anthropic.BadRequestError as exc:
        assert exc.body["error"]["type"] == "invalid_request_error" and "max_tokens" in str(exc)  # type: ignore[index]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    try:
        client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [image]}])
        raise AssertionError("an image was accepted")
    except anthropic.BadRequestError as exc:
        assert "image" in str(exc)


# ---- the OpenAI Agents SDK, its default model (the Responses API) ----


class Short(pydantic.BaseModel):
    answer: str = pydantic.Field(max_length=12)


def agents_run(url: str, model: str) -> None:
    from agents import (
        Agent,
        ModelSettings,
        Runner,
        function_tool,
        set_default_openai_client,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)

    def client() -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)

    set_default_openai_client(client())
    seen: list[str] = []

    @function_tool  # bounded arguments: the grammar ends the call on any weights (CALL_TOKENS)
    def get_weather(
        city: Annotated[str, pydantic.Field(max_length=12)], days: Annotated[int, pydantic.Field(ge=1, le=7)]
    ) -> str:
        """Weather forecast for a city."""
        seen.append(city)
        return f"sunny in {city} for {days} days"

    settings = ModelSettings(
        max_tokens=CALL_TOKENS, tool_choice="required", parallel_tool_calls=False, temperature=0
    )
    agent = Agent(
        name="forecaster",
        instructions="Answer with the weather.",
        model=model,
        tools=[get_weather],
        model_settings=settings,
        tool_use_behavior="stop_on_first_tool",
    )
    result = Runner.run_sync(agent, ASK, max_turns=2)
    assert seen and result.final_output.startswith(f"sunny in {seen[0]} for ")
    # an answer in a bounded JSON schema (the SDK sends it as text.format): the grammar ends it, so
    # the run completes on any weights (an answer cut by max_output_tokens is an error to the SDK)
    plain = Agent(
        name="talker",
        instructions="Be brief.",
        model=model,
        output_type=Short,
        model_settings=ModelSettings(max_tokens=most_tokens({"answer": "\0" * 12})),
    )
    answer = Runner.run_sync(plain, "Hello")
    assert isinstance(answer.final_output, Short) and answer.raw_responses[0].usage.output_tokens > 0

    async def streamed() -> list[str]:
        set_default_openai_client(client())  # a client of this event loop (run_sync had its own)
        run = Runner.run_streamed(plain, "Hello again")
        kinds = [e.type async for e in run.stream_events()]
        assert isinstance(run.final_output, Short)
        return kinds

    assert "raw_response_event" in asyncio.run(streamed())
