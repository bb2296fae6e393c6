"""Ollama's generating routes: POST /api/chat and /api/generate, NDJSON streamed unless `"stream": false`.

A translation over the chat pipeline: the body becomes a chat request (`ollama/translate.py`), runs
through `pipeline/chat_run`, and its parts become Ollama's objects, one JSON object a line; the last
has `done: true`, the token counts and the durations from the engine's own timings. Errors, before
the reply or during a stream, are Ollama's `{"error": "..."}`.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from outpost.api.errors import ApiError
from outpost.api.ollama import models
from outpost.api.ollama.keepalive import apply_keep_alive, keep_alive_seconds, load_or_unload
from outpost.api.ollama.raw import start_raw
from outpost.api.ollama.translate import (
    ChatBody,
    GenerateBody,
    chat_messages,
    chat_request,
    generate_messages,
    guarded,
    parse,
    refuse_unserved,
)
from outpost.api.pipeline import mapping
from outpost.api.pipeline.chat_run import ChatRun, Ending, Protocol, answer_parts, collect, start_chat
from outpost.api.pipeline.generation import failure
from outpost.api.pipeline.sse import sse_response
from outpost.api.record import record_of
from outpost.api.state import ServerState, state_of
from outpost.backend import InferenceBackend

router = APIRouter()
router.include_router(models.router)
CHAT = Protocol("ollama", mapping.Names("messages", "num_predict"), most_choices=1)
GENERATE = Protocol("ollama", mapping.Names("prompt", "num_predict"), most_choices=1)
NDJSON = "application/x-ndjson"


def now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _calls(ending: Ending) -> list[dict[str, Any]]:
    out = []
    for i, call in enumerate(ending.calls):
        try:
            args = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            args = {}
        out.append({"function": {"index": i, "name": call["function"]["name"], "arguments": args}})
    return out


def _final(run: ChatRun, ending: Ending, started_ns: int) -> dict[str, Any]:
    """The counts and durations of the last object; the engine's timings are in milliseconds."""
    t = ending.out.timings
    return {
        "done": True,
        "done_reason": "length" if ending.finish == "length" else "stop",
        "total_duration": time.monotonic_ns() - started_ns,
        "load_duration": 0,  # the model is loaded when the server starts, not per request
        "prompt_eval_count": len(run.gen.request.prompt_tokens),
        "prompt_eval_duration": round(t.prompt_ms * 1e6),
        "eval_count": len(ending.out.token_ids),
        "eval_duration": round(t.predicted_ms * 1e6),
    }


Shape = Callable[[str, str, Ending | None], dict[str, Any]]  # (thinking, content, ending) -> fields


def _chat_shape(thinking: str, content: str, ending: Ending | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if ending is not None and ending.calls:
        message["tool_calls"] = _calls(ending)
    return {"message": message}


def _generate_shape(thinking: str, content: str, ending: Ending | None) -> dict[str, Any]:
    return {"response": content, **({"thinking": thinking} if thinking else {})}


@router.post("/api/chat", tags=["ollama"])
async def chat(request: Request) -> Response:
    """The next assistant message for `messages`, streamed as NDJSON unless `"stream": false`."""
    raw = await request.body()
    return await guarded(_chat(request, raw), _model_of(raw))


@router.post("/api/generate", tags=["ollama"])
async def generate(request: Request) -> Response:
    """A response to `prompt` (with `system`) under the model's chat template, streamed as NDJSON."""
    raw = await request.body()
    return await guarded(_generate(request, raw), _model_of(raw))


def _model_of(raw: bytes) -> str | None:
    try:
        model = json.loads(raw).get("model")
    except (ValueError, AttributeError):
        return None
    return model if isinstance(model, str) else None


async def _chat(request: Request, raw: bytes) -> Response:
    body: ChatBody = parse(raw, ChatBody)
    keep = _keep_alive(request, body)
    if not body.messages:
        return await _loaded(request, body.model, keep, {"message": {"role": "assistant", "content": ""}})
    chat = chat_request(body, chat_messages(body.messages))
    started = time.monotonic_ns()
    run = await start_chat(state_of(request), chat, request, CHAT)
    return await _answer(request, body, run, _chat_shape, started)


async def _generate(request: Request, raw: bytes) -> Response:
    body: GenerateBody = parse(raw, GenerateBody)
    keep = _keep_alive(request, body)
    if not body.prompt and not body.images:
        return await _loaded(request, body.model, keep, {"response": ""})
    started = time.monotonic_ns()
    if body.raw:
        refuse_unserved(body)
        run = await start_raw(state_of(request), body, request)
        return await _answer(request, body, run, _with_context(run), started)
    chat = chat_request(body, generate_messages(body))
    run = await start_chat(state_of(request), chat, request, GENERATE)
    return await _answer(request, body, run, _generate_shape, started)


def _with_context(run: ChatRun) -> Shape:
    """Raw replies carry `context`: the prompt's tokens and the answer's, to continue from."""

    def shape(thinking: str, content: str, ending: Ending | None) -> dict[str, Any]:
        fields = _generate_shape(thinking, content, ending)
        if ending is not None:
            fields["context"] = [*run.gen.request.prompt_tokens, *ending.out.token_ids]
        return fields

    return shape


def _target(request: Request, model: str) -> InferenceBackend | None:
    """The backend a generating request names: by name, or the only one (any name answers then)."""
    state = state_of(request)
    served = models.served(state, model)
    if served is None and len(state.backends) == 1:
        return next(iter(state.backends.values()))
    return served[1] if served is not None else None


def _keep_alive(request: Request, body: ChatBody | GenerateBody) -> float | None:
    """The request's keep_alive, given to its model (when served) for after this request."""
    seconds = keep_alive_seconds(body.keep_alive)
    apply_keep_alive(_target(request, body.model), seconds)
    return seconds


async def _loaded(request: Request, model: str, seconds: float | None, fields: dict[str, Any]) -> Response:
    """The reply to an empty request, Ollama's way to load (or, keep_alive 0, unload) a model."""
    backend = _target(request, model)
    if backend is None:
        raise ApiError(404, f"model '{model}' not found")
    reason = await load_or_unload(backend, seconds)
    return JSONResponse({"model": model, "created_at": now(), **fields, "done": True, "done_reason": reason})


async def _answer(
    request: Request, body: ChatBody | GenerateBody, run: ChatRun, shape: Shape, started: int
) -> Response:
    state = state_of(request)
    head = {"model": body.model}
    if body.stream:
        return sse_response(_stream(state, request, run, head, shape, started), run.gens, NDJSON)
    answer = await collect(state, request, run)
    reply = {**head, "created_at": now(), **shape(answer.reasoning, answer.content, answer.ending)}
    return JSONResponse({**reply, **_final(run, answer.ending, started)})


async def _stream(
    state: ServerState, request: Request, run: ChatRun, head: dict[str, Any], shape: Shape, started: int
) -> AsyncIterator[bytes]:
    try:
        async for piece in answer_parts(run, state.config.request_timeout):
            if isinstance(piece, Ending):
                record_of(request).add_outcome(piece.out, run.prompt, state.config.log_prompts)
                last = {**head, "created_at": now(), **shape("", "", piece), **_final(run, piece, started)}
                yield _line(last)
                return
            yield _line(
                {**head, "created_at": now(), **shape(piece.reasoning, piece.content, None), "done": False}
            )
    except Exception as exc:
        yield _line({"error": failure(exc).worded()})
