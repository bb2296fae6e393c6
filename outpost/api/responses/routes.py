"""OpenAI's Responses API: POST /v1/responses (streamed or not), GET and DELETE /v1/responses/{id}.

A translation over the chat pipeline: the body becomes a chat request (`responses/translate.py`), runs
through `pipeline/chat_run`, and its answer becomes output items and events (`responses/render.py`). Finished
responses are kept in the process's bounded store (`responses/store.py`) unless `store` is false, so a
follow-up may name one in `previous_response_id`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from outpost.api.errors import ApiError, bad_request
from outpost.api.pipeline import chat_run, mapping
from outpost.api.pipeline.chat_run import ChatRun, Ending, Protocol, answer_parts, collect, start_chat
from outpost.api.pipeline.generation import failure
from outpost.api.pipeline.sse import sse_response, with_keepalive
from outpost.api.record import record_of
from outpost.api.responses.render import (
    EventWriter,
    ResponseDraft,
    call_item,
    final_status,
    history_messages,
    message_item,
    new_id,
    output_items,
    reasoning_item,
    text_part,
)
from outpost.api.responses.store import ResponseStore
from outpost.api.responses.translate import ResponsesRequest, chat_request, input_messages
from outpost.api.state import ServerState, state_of

router = APIRouter()
RESPONSES = Protocol("resp", mapping.Names("input", "max_output_tokens"), most_choices=1)
ARG_PIECES = 3  # argument deltas per call: clients must join them, so send several


def store_of(request: Request) -> ResponseStore:
    store = request.app.state.responses
    assert isinstance(store, ResponseStore)
    return store


def _previous(store: ResponseStore, rid: str | None) -> list[dict[str, Any]]:
    if rid is None:
        return []
    found = store.get(rid)
    if found is None:
        raise bad_request(
            f"previous response {rid!r} is not stored here: this server keeps its last {store.max_items} "
            f"responses for {store.ttl:g} s, in this process only (behind several gateways, each keeps "
            "its own); send the whole conversation in `input` instead",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return found.messages


@router.post("/v1/responses", tags=["openai"])
@router.post("/responses", include_in_schema=False)  # llama-server's unprefixed alias
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """A model response to `input` (after `previous_response_id`), streamed as events with `stream`."""
    state, store = state_of(request), store_of(request)
    previous = _previous(store, body.previous_response_id)
    history = [*previous, *input_messages(body)]
    run = await start_chat(state, chat_request(body, previous), request, RESPONSES)
    draft = ResponseDraft(body, run.model_id, id=run.rid.replace("resp-", "resp_"))
    if body.stream:
        events = _stream(state, request, run, draft, history)
        return sse_response(with_keepalive(events, state.config.sse_keepalive), [run.gen])
    answer = await collect(state, request, run)
    output = output_items(answer.reasoning, answer.content, answer.ending)
    reply = draft.response(final_status(answer.ending), output, answer.ending)
    if body.store:
        store.put(draft.id, reply, [*history, *history_messages(output)])
    return JSONResponse(reply)


@router.post("/v1/responses/input_tokens", tags=["openai"])
@router.post("/responses/input_tokens", include_in_schema=False)
async def response_input_tokens(body: ResponsesRequest, request: Request) -> dict[str, Any]:
    """The prompt tokens `input` (after `previous_response_id`) would take, as OpenAI and llama-server
    answer it."""
    chat = chat_request(body, _previous(store_of(request), body.previous_response_id))
    n = await chat_run.input_tokens(state_of(request), chat)
    return {"input_tokens": n, "object": "response.input_tokens"}


@router.get("/v1/responses/{response_id}", tags=["openai"])
async def get_response(response_id: str, request: Request) -> dict[str, Any]:
    """A stored response (this process's store: see `previous_response_id`)."""
    found = store_of(request).get(response_id)
    if found is None:
        raise ApiError(404, f"no response {response_id!r} is stored here", param="response_id")
    return found.response


@router.delete("/v1/responses/{response_id}", tags=["openai"])
async def delete_response(response_id: str, request: Request) -> dict[str, Any]:
    if not store_of(request).delete(response_id):
        raise ApiError(404, f"no response {response_id!r} is stored here", param="response_id")
    return {"id": response_id, "object": "response.deleted", "deleted": True}


@dataclass
class _Open:
    kind: str  # "reasoning" | "message"
    index: int
    id: str
    text: list[str] = field(default_factory=list)


class _Output:
    """The streamed output items: opens, fills and closes them, as events."""

    def __init__(self, w: EventWriter) -> None:
        self.w = w
        self.items: list[dict[str, Any]] = []
        self.open: _Open | None = None
        self.has_message = False

    def add_text(self, kind: str, text: str) -> list[bytes]:
        out = []
        if self.open is not None and self.open.kind != kind:
            out += self.close("completed")
        if self.open is None:
            out += self._start(kind)
        cur = self.open
        assert cur is not None
        cur.text.append(text)
        where: dict[str, Any] = {"item_id": cur.id, "output_index": cur.index, "content_index": 0}
        if kind == "message":
            return [*out, self.w.event("response.output_text.delta", delta=text, logprobs=[], **where)]
        return [*out, self.w.event("response.reasoning_text.delta", delta=text, **where)]

    def _start(self, kind: str) -> list[bytes]:
        cur = self.open = _Open(kind, len(self.items), new_id("msg" if kind == "message" else "rs"))
        self.has_message |= kind == "message"
        if kind == "message":
            item, part = message_item(cur.id, None, "in_progress"), text_part("")
        else:
            item = {**reasoning_item(cur.id, "", "in_progress"), "content": []}
            part = {"type": "reasoning_text", "text": ""}
        self.items.append(item)
        where = {"item_id": cur.id, "output_index": cur.index, "content_index": 0}
        return [
            self.w.event("response.output_item.added", output_index=cur.index, item=item),
            self.w.event("response.content_part.added", part=part, **where),
        ]

    def close(self, status: str) -> list[bytes]:
        cur, self.open = self.open, None
        if cur is None:
            return []
        text = "".join(cur.text)
        where = {"item_id": cur.id, "output_index": cur.index, "content_index": 0}
        if cur.kind == "message":
            item, part = message_item(cur.id, text, status), text_part(text)
            done = self.w.event("response.output_text.done", text=text, logprobs=[], **where)
        else:
            item, part = reasoning_item(cur.id, text), {"type": "reasoning_text", "text": text}
            done = self.w.event("response.reasoning_text.done", text=text, **where)
        self.items[cur.index] = item
        return [
            done,
            self.w.event("response.content_part.done", part=part, **where),
            self.w.event("response.output_item.done", output_index=cur.index, item=item),
        ]

    def call(self, call: dict[str, Any]) -> list[bytes]:
        index, done = len(self.items), call_item(call)
        self.items.append(done)
        args, where = done["arguments"], {"item_id": done["id"], "output_index": index}
        started = call_item(call, "", "in_progress")
        out = [self.w.event("response.output_item.added", output_index=index, item=started)]
        step = max(1, -(-len(args) // ARG_PIECES))
        for delta in (args[at : at + step] for at in range(0, len(args), step)):
            out.append(self.w.event("response.function_call_arguments.delta", delta=delta, **where))
        name = done["name"]
        out.append(self.w.event("response.function_call_arguments.done", arguments=args, name=name, **where))
        out.append(self.w.event("response.output_item.done", output_index=index, item=done))
        return out

    def finish(self, ending: Ending) -> list[bytes]:
        status = final_status(ending)
        out = self.close(status)
        if not self.has_message and not ending.calls:  # an empty answer is still one message
            out = [*out, *self._start("message"), *self.close(status)]
        for call in ending.calls:
            out += self.call(call)
        return out


async def _stream(
    state: ServerState, request: Request, run: ChatRun, draft: ResponseDraft, history: list[dict[str, Any]]
) -> AsyncIterator[bytes]:
    w = EventWriter()
    items = _Output(w)
    yield w.event("response.created", response=draft.response("in_progress", []))
    yield w.event("response.in_progress", response=draft.response("in_progress", []))
    try:
        async for piece in answer_parts(run, state.config.request_timeout):
            if isinstance(piece, Ending):
                for chunk in items.finish(piece):
                    yield chunk
                status = final_status(piece)
                reply = draft.response(status, items.items, piece)
                record_of(request).add_outcome(piece.out, run.prompt, state.config.log_prompts)
                if draft.body.store:
                    store_of(request).put(draft.id, reply, [*history, *history_messages(items.items)])
                yield w.event(f"response.{status}", response=reply)
                return
            for kind, text in (("reasoning", piece.reasoning), ("message", piece.content)):
                if text:
                    for chunk in items.add_text(kind, text):
                        yield chunk
    except Exception as exc:
        err = failure(exc)
        error = {"code": err.code or err.type, "message": err.worded()}
        yield w.event("response.failed", response=draft.response("failed", items.items, error=error))
