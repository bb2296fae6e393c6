"""Anthropic's Messages API: POST /v1/messages (streamed or not) and /v1/messages/count_tokens.

A translation over the chat pipeline: the body becomes a chat request (`anthropic/translate.py`),
runs through `pipeline/chat_run`, and its answer becomes content blocks (`thinking`, `text`,
`tool_use`), or Anthropic's stream events for them. Every error, a refusal before the reply or a
failure during a stream, is in Anthropic's envelope. The `anthropic-version` header is accepted and
not checked; the key comes as `x-api-key` (auth.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from outpost.api.anthropic.translate import CountTokensRequest, MessagesRequest, bad, chat_request
from outpost.api.errors import ApiError
from outpost.api.pipeline import mapping
from outpost.api.pipeline.chat_run import (
    ChatRun,
    Ending,
    Protocol,
    answer_parts,
    collect,
    input_tokens,
    start_chat,
)
from outpost.api.pipeline.generation import Outcome, failure
from outpost.api.pipeline.sse import sse, sse_response, with_keepalive
from outpost.api.record import record_of
from outpost.api.state import ServerState, state_of

router = APIRouter()
MESSAGES = Protocol("msg", mapping.Names("messages", "max_tokens"), most_choices=1)
JSON_PIECES = 3  # input_json_delta events per tool call: clients must join them, so send several
ERROR_TYPES = {  # Anthropic's error type for each status
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "invalid_request_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _error(err: ApiError) -> dict[str, Any]:
    """Anthropic's error object, as a reply's envelope and a stream's `error` event carry it."""
    return {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.worded()}


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse({"type": "error", "error": _error(err)}, status_code=err.status, headers=err.headers)


async def _guarded(work: Awaitable[Response]) -> Response:
    try:
        return await work
    except ApiError as err:
        return error_response(err)


async def _parse(request: Request, model: type[MessagesRequest]) -> MessagesRequest:
    try:
        raw = json.loads(await request.body())
    except ValueError as exc:
        raise bad(f"the request body is not valid JSON: {exc}") from None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "body"
        raise bad(f"{where}: {str(first.get('msg')).removeprefix('Value error, ')}") from None


@router.post("/v1/messages", tags=["anthropic"])
async def messages(request: Request) -> Response:
    """A model message in reply to `messages`, streamed as Anthropic's events with `stream`."""
    return await _guarded(_messages(request))


@router.post("/v1/messages/count_tokens", tags=["anthropic"])
async def count_tokens(request: Request) -> Response:
    """The prompt tokens `messages` (with `system` and `tools`) would take."""
    return await _guarded(_count_tokens(request))


async def _messages(request: Request) -> Response:
    state = state_of(request)
    body = await _parse(request, MessagesRequest)
    run = await start_chat(state, chat_request(body), request, MESSAGES)
    mid = run.rid.replace("msg-", "msg_")
    if body.stream:
        events = _stream(state, request, run, mid)
        return sse_response(with_keepalive(events, state.config.sse_keepalive), [run.gen])
    answer = await collect(state, request, run)
    blocks = [{"type": "thinking", "thinking": answer.reasoning, "signature": ""}] if answer.reasoning else []
    if answer.content or not answer.ending.calls:
        blocks.append({"type": "text", "text": answer.content})
    blocks += [_tool_use(c) for c in answer.ending.calls]
    return JSONResponse(_message(mid, run, blocks, answer.ending))


async def _count_tokens(request: Request) -> Response:
    body = await _parse(request, CountTokensRequest)
    return JSONResponse({"input_tokens": await input_tokens(state_of(request), chat_request(body))})


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    try:
        args = json.loads(call["function"]["arguments"] or "{}")
    except ValueError:
        args = {}
    return {"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": args}


def stop_reason(ending: Ending) -> str:
    if ending.calls:
        return "tool_use"
    if ending.finish == "length":
        return "max_tokens"
    return "stop_sequence" if ending.stop_string is not None else "end_turn"


def _usage(run: ChatRun, out: Outcome | None) -> dict[str, Any]:
    """Anthropic's counts: input_tokens are those read afresh, the cached ones are apart (their sum
    is the prompt), as its API reports them."""
    cached = out.timings.cache_n if out else 0
    return {
        "input_tokens": len(run.gen.request.prompt_tokens) - cached,
        "output_tokens": len(out.token_ids) if out else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def _message(mid: str, run: ChatRun, content: list[dict[str, Any]], ending: Ending | None) -> dict[str, Any]:
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": run.model_id,
        "content": content,
        "stop_reason": stop_reason(ending) if ending is not None else None,
        "stop_sequence": ending.stop_string if ending is not None else None,
        "usage": _usage(run, ending.out if ending is not None else None),
    }


def event(kind: str, **fields: Any) -> bytes:
    return sse({"type": kind, **fields}, event=kind)


class _Blocks:
    """The streamed content blocks: opens a block when the kind of text changes, closes it after."""

    def __init__(self) -> None:
        self.index = -1
        self.kind: str | None = None
        self.has_text = False

    def text(self, kind: str, text: str) -> list[bytes]:
        out = []
        if self.kind != kind:
            out += self.close()
            self.index += 1
            self.kind = kind
            self.has_text |= kind == "text"
            # kind is "thinking" or "text": the block's type and the name of its text field
            start = {"type": kind, kind: "", **({"signature": ""} if kind == "thinking" else {})}
            out.append(event("content_block_start", index=self.index, content_block=start))
        delta = {"type": f"{kind}_delta", kind: text}
        return [*out, event("content_block_delta", index=self.index, delta=delta)]

    def close(self) -> list[bytes]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", index=self.index)]

    def finish(self, ending: Ending) -> list[bytes]:
        out = self.close()
        if not self.has_text and not ending.calls:  # an empty answer is still one text block
            out += [*self.text("text", "")[:1], *self.close()]
        for call in ending.calls:
            self.index += 1
            block = {**_tool_use(call), "input": {}}
            out.append(event("content_block_start", index=self.index, content_block=block))
            args = call["function"]["arguments"] or "{}"
            step = max(1, -(-len(args) // JSON_PIECES))
            for at in range(0, len(args), step):
                delta = {"type": "input_json_delta", "partial_json": args[at : at + step]}
                out.append(event("content_block_delta", index=self.index, delta=delta))
            out.append(event("content_block_stop", index=self.index))
        return out


async def _stream(state: ServerState, request: Request, run: ChatRun, mid: str) -> AsyncIterator[bytes]:
    yield event("message_start", message=_message(mid, run, [], None))
    blocks = _Blocks()
    try:
        async for piece in answer_parts(run, state.config.request_timeout):
            if isinstance(piece, Ending):
                for chunk in blocks.finish(piece):
                    yield chunk
                record_of(request).add_outcome(piece.out, run.prompt, state.config.log_prompts)
                delta = {"stop_reason": stop_reason(piece), "stop_sequence": piece.stop_string}
                yield event("message_delta", delta=delta, usage=_usage(run, piece.out))
                yield event("message_stop")
                return
            for kind, text in (("thinking", piece.reasoning), ("text", piece.content)):
                if text:
                    for chunk in blocks.text(kind, text):
                        yield chunk
    except Exception as exc:
        yield event("error", error=_error(failure(exc)))
