"""A Responses API request body -> a `ChatCompletionRequest` (and the chat messages it stands for).

`instructions` becomes the system message and `input` the chat history after the stored history of
`previous_response_id` (reasoning items are dropped, as templates drop earlier thinking). What
cannot be served (images, hosted tools, item references) is a 400 naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from outpost.api.errors import bad_request
from outpost.api.pipeline.schemas import ChatCompletionRequest


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    previous_response_id: str | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    n: int | None = None  # not OpenAI's: a client that sends it hears it is 1 here, not silence
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = None
    reasoning: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None


def _text_of(content: Any, param: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise bad_request("content must be a string or a list of parts", param=param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text", "refusal"):
            raise bad_request(f"content part type {kind!r} is not supported: send text parts", f"{param}.{i}")
        texts.append(str(part.get("text") or part.get("refusal") or ""))
    return "".join(texts)


def _add_call(messages: list[dict[str, Any]], item: dict[str, Any], param: str) -> None:
    if not all(isinstance(item.get(k), str) and item[k] for k in ("call_id", "name")):
        raise bad_request("a function_call item needs call_id and name", param=param)
    if not isinstance(item.get("arguments", ""), str):
        raise bad_request("function_call arguments must be a JSON string", param=f"{param}.arguments")
    fn = {"name": item["name"], "arguments": item.get("arguments") or "{}"}
    call = {"id": item["call_id"], "type": "function", "function": fn}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":  # one assistant turn: its text, then its calls
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def input_messages(body: ResponsesRequest) -> list[dict[str, Any]]:
    """`input` as chat message dicts (no system message for `instructions`: see `chat_request`)."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(body.input):
        param = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise bad_request(f"message role {role!r} is not supported", param=f"{param}.role")
            text = _text_of(item.get("content"), f"{param}.content")
            messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "function_call":
            _add_call(messages, item, param)
        elif kind == "function_call_output":
            output = _text_of(item.get("output"), f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind != "reasoning":
            raise bad_request(f"input item type {kind!r} is not supported here", param=f"{param}.type")
    return messages


def _tools(body: ResponsesRequest) -> list[dict[str, Any]] | None:
    if body.tools is None:
        return None
    out = []
    for i, tool in enumerate(body.tools):
        if tool.get("type") != "function":
            raise bad_request(
                f"tool type {tool.get('type')!r} is not supported: only function tools", f"tools.{i}.type"
            )
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise bad_request(f"tool_choice type {choice.get('type')!r} is not supported", "tool_choice")
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if fmt is not None and not isinstance(fmt, dict):
        raise bad_request("text.format must be an object", param="text.format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise bad_request("text.format json_schema needs a schema object", param="text.format.schema")
        spec = {"name": fmt.get("name"), "schema": fmt["schema"], "strict": fmt.get("strict")}
        return {"type": "json_schema", "json_schema": spec}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    raise bad_request(f"text.format type {fmt.get('type')!r} is not supported", param="text.format.type")


def chat_request(body: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request for `body` after `history` (the previous response's conversation)."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages = [*system, *history, *input_messages(body)]
    if not any(m["role"] != "system" for m in messages):
        raise bad_request("input must hold at least one message", param="input")
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        "max_completion_tokens": body.max_output_tokens,
        "n": body.n,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tools": _tools(body),
        "tool_choice": _tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _response_format(body.text),
    }
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise bad_request(f"{where}: {first.get('msg')}", param=where or None) from None
