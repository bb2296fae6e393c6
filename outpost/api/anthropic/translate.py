"""An Anthropic Messages request body -> a `ChatCompletionRequest`.

Content blocks become chat messages (`tool_use` an assistant turn's tool calls, `tool_result` tool
messages, `thinking` the turn's `reasoning_content`, as llama-server converts them: the template
decides what to show); tools, tool_choice and the sampling fields map to their chat names. What
cannot be served (images, documents, server tools) is a 400 (routes.py gives it in Anthropic's envelope).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from outpost.api.errors import ApiError
from outpost.api.pipeline.schemas import ChatCompletionRequest, chat_from_fields


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int = Field(ge=1)
    n: int | None = None  # not Anthropic's: a client that sends it hears it is 1 here, not silence
    stop_sequences: list[str] | None = Field(None, max_length=16)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)
    tool_choice: dict[str, Any] | None = None
    stream: bool = False
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesRequest):
    max_tokens: int = 1


def bad(message: str) -> ApiError:
    return ApiError(400, message)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise bad(f"{where}.content: must be a string or a list of content blocks")
    return content


def _text(blocks: Any, where: str) -> str:
    parts = []
    for j, block in enumerate(_blocks(blocks, where)):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad(f"{where}.content.{j}: block type {block.get('type')!r} is not supported here")
        parts.append(block["text"])
    return "".join(parts)


def _assistant(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    text, calls, thinking = [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text") or ""))
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise bad(f"{where}.content.{j}: a tool_use block needs id and name")
            args = json.dumps(block.get("input") or {}, ensure_ascii=False)
            fn = {"name": block["name"], "arguments": args}
            calls.append({"id": block["id"], "type": "function", "function": fn})
        elif kind == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif kind != "redacted_thinking":  # encrypted elsewhere: nothing a template could show
            raise bad(f"{where}.content.{j}: block type {kind!r} is not supported in an assistant turn")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if calls:
        message["tool_calls"] = calls
    return message


def _user(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    results, text = [], []
    for j, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "tool_result":
            content = block.get("content")
            body = _text(content, f"{where}.content.{j}") if content is not None else ""
            if block.get("is_error"):
                body = f"Error: {body}"
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": body})
        elif kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        else:
            raise bad(f"{where}.content.{j}: block type {kind!r} is not supported: send text or tool_result")
    return [*results, {"role": "user", "content": "".join(text)}] if text else results


def chat_messages(body: MessagesRequest) -> list[dict[str, Any]]:
    system = _text(body.system, "system") if body.system is not None else ""
    messages = [{"role": "system", "content": system}] if system else []
    for i, m in enumerate(body.messages):
        where, role = f"messages.{i}", m.get("role")
        blocks = _blocks(m.get("content"), where)
        if role == "assistant":
            messages.append(_assistant(blocks, where))
        elif role == "user":
            messages += _user(blocks, where)
        else:
            raise bad(f"{where}.role: must be 'user' or 'assistant', got {role!r}")
    return messages


def _tools(body: MessagesRequest) -> list[dict[str, Any]] | None:
    if not body.tools:
        return None
    out = []
    for i, tool in enumerate(body.tools):
        if tool.get("type") not in (None, "custom"):
            raise bad(f"tools.{i}.type: server tool {tool.get('type')!r} is not supported: only client tools")
        fn = {
            "name": tool.get("name"),
            "description": tool.get("description"),
            "parameters": tool.get("input_schema"),
        }
        out.append({"type": "function", "function": fn})
    return out


def _choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None]:
    if choice is None:
        return None, None
    parallel = False if choice.get("disable_parallel_tool_use") else None
    kind = choice.get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    names = {"auto": "auto", "any": "required", "none": "none"}
    if kind not in names:
        raise bad(f"tool_choice.type: {kind!r} is not one of auto, any, tool, none")
    return names[kind], parallel


def chat_request(body: MessagesRequest) -> ChatCompletionRequest:
    choice, parallel = _choice(body.tool_choice)
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": chat_messages(body),
        "max_tokens": body.max_tokens,
        "n": body.n,
        "stop": body.stop_sequences,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "tools": _tools(body),
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    try:
        return chat_from_fields(fields)
    except ValueError as exc:
        raise bad(str(exc)) from None
