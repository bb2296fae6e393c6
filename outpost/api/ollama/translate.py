"""Ollama's request bodies -> a `ChatCompletionRequest`, and Ollama's error envelope.

`/api/chat`'s messages become chat messages; `/api/generate`'s `system` + `prompt` become a
two-turn chat (the model's template applies, as Ollama does unless `raw`: `raw.py`). `options` map
to the sampler, `format` to response_format, `think` to the template's enable_thinking. What cannot
be served (`images`, `suffix`, a `template` of the request's own, `context` without `raw`) is a
400, which `error_response` gives as Ollama's `{"error": "..."}`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from typing import Any

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from outpost.api.errors import ApiError
from outpost.api.pipeline.schemas import ChatCompletionRequest, chat_from_fields


def bad(message: str) -> ApiError:
    return ApiError(400, message)


def error_response(err: ApiError, model: str | None = None) -> JSONResponse:
    """`err` in Ollama's envelope; an unknown `model` is Ollama's 404 naming it."""
    if err.code == "model_not_found" and model:
        return JSONResponse({"error": f"model '{model}' not found"}, status_code=404, headers=err.headers)
    return JSONResponse({"error": err.worded()}, status_code=err.status, headers=err.headers)


async def guarded(work: Awaitable[Response], model: str | None = None) -> Response:
    """`work`'s reply, or its refusal in Ollama's envelope."""
    try:
        return await work
    except ApiError as err:
        return error_response(err, model)


class Options(BaseModel):
    """Ollama's `options` that change the answer; the rest (num_gpu, num_thread, ...) are the
    server's and ignored per request, as Ollama ignores those it cannot change after load."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    temperature: float | None = Field(None, ge=0.0, le=100.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    num_ctx: int | None = Field(None, ge=1)
    num_predict: int | None = Field(None, ge=-2)
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = Field(None, gt=0.0, le=100.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)


class Common(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str = Field(min_length=1)
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: Options = Field(default_factory=Options)
    think: bool | str | None = None
    keep_alive: str | int | float | None = None  # accepted; the model stays loaded (docs/ollama.md)
    tools: list[dict[str, Any]] | None = Field(None, max_length=128)


class ChatBody(Common):
    messages: list[dict[str, Any]] = Field(default_factory=list)


class GenerateBody(Common):
    prompt: str | None = None
    system: str | None = None
    suffix: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = None


def parse(raw: bytes, model: type[Common]) -> Any:
    try:
        return model.model_validate(json.loads(raw))
    except ValueError as exc:
        if not isinstance(exc, ValidationError):
            raise bad(f"invalid JSON body: {exc}") from None
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise bad(f"{where}: {str(first.get('msg')).removeprefix('Value error, ')}") from None


def _calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad(f"{where}.tool_calls: must be a list")
    calls = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise bad(f"{where}.tool_calls.{j}: needs function.name")
        args = fn.get("arguments") or {}
        text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        calls.append(
            {"id": f"call_{j}", "type": "function", "function": {"name": fn["name"], "arguments": text}}
        )
    return calls


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ollama's turns as chat messages; a `tool` turn answers the latest call of its `tool_name`."""
    out: list[dict[str, Any]] = []
    ids: dict[str, str] = {}
    for i, m in enumerate(messages):
        where, role = f"messages.{i}", m.get("role")
        if m.get("images"):
            raise bad(f"{where}.images: this server's models read text only; images are not supported")
        if role not in ("system", "user", "assistant", "tool"):
            raise bad(f"{where}.role: must be system, user, assistant or tool, got {role!r}")
        content = m.get("content") or ""
        if not isinstance(content, str):
            raise bad(f"{where}.content: must be a string")
        message: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and m.get("tool_calls"):
            message["tool_calls"] = _calls(m["tool_calls"], where)
            for call in message["tool_calls"]:
                call["id"] = f"call_{i}_{call['id'][5:]}"
                ids[call["function"]["name"]] = call["id"]
        if role == "assistant" and isinstance(m.get("thinking"), str) and m["thinking"]:
            message["reasoning_content"] = m["thinking"]
        if role == "tool":
            name = m.get("tool_name") or m.get("name")
            message["tool_call_id"] = ids.get(str(name), next(reversed(ids.values()), "call_0"))
        out.append(message)
    return out


def _format(fmt: str | dict[str, Any] | None) -> dict[str, Any] | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, dict):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}
    raise bad(f'format: must be "json" or a JSON schema object, got {fmt!r}')


def chat_request(body: Common, messages: list[dict[str, Any]]) -> ChatCompletionRequest:
    opts = body.options
    kwargs = None if body.think is None else {"enable_thinking": body.think not in (False, "false")}
    fields: dict[str, Any] = {
        "model": body.model,
        "messages": messages,
        # Ollama's -1 (no limit) and -2 (fill the context) are both what the context leaves
        "max_tokens": -1 if opts.num_predict is not None and opts.num_predict < 0 else opts.num_predict,
        "stop": opts.stop,
        "temperature": opts.temperature,
        "top_p": opts.top_p,
        "top_k": opts.top_k,
        "min_p": opts.min_p,
        "seed": opts.seed,
        "repeat_penalty": opts.repeat_penalty,
        "presence_penalty": opts.presence_penalty,
        "frequency_penalty": opts.frequency_penalty,
        "response_format": _format(body.format),
        "tools": body.tools or None,
        "chat_template_kwargs": kwargs,
    }
    try:
        return chat_from_fields(fields)
    except ValueError as exc:
        raise bad(str(exc)) from None


def refuse_unserved(body: GenerateBody) -> None:
    """What /api/generate cannot serve, raw or not, as a 400 naming the field."""
    if body.images:
        raise bad("images: this server's models read text only; images are not supported")
    if body.suffix:
        raise bad("suffix: fill-in-the-middle is not served on /api/generate; use /infill")
    if body.template:
        raise bad("template: the model's own chat template is used; a request's template is not supported")


def generate_messages(body: GenerateBody) -> list[dict[str, Any]]:
    """`system` + `prompt` as chat turns; what /api/generate cannot serve here is a 400."""
    refuse_unserved(body)
    if body.context:
        raise bad(
            'context: continuing from earlier tokens needs "raw": true; or send the conversation to /api/chat'
        )
    system = [{"role": "system", "content": body.system}] if body.system else []
    return [*system, {"role": "user", "content": body.prompt or ""}]
