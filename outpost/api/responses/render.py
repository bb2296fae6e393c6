"""Responses API objects as plain dicts: the `response`, its output items, and the streamed events.

`ResponseDraft` holds what the request asked (echoed in the response as OpenAI does) and turns an
answer from `chat_run` into output items (`reasoning`, `message`, `function_call`); `EventWriter`
numbers and frames the events the `openai` SDK's `responses.stream()` assembles.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from outpost.api.pipeline.chat_run import Ending
from outpost.api.pipeline.sse import sse
from outpost.api.responses.translate import ResponsesRequest


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(ending: Ending) -> dict[str, Any]:
    out = ending.out
    n_out = len(out.token_ids)
    return {
        "input_tokens": out.n_prompt,
        "input_tokens_details": {"cached_tokens": out.timings.cache_n},
        "output_tokens": n_out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": out.n_prompt + n_out,
    }


def reasoning_item(rid: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": rid, "summary": [], "content": content, "status": status}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(mid: str, text: str | None, status: str = "completed") -> dict[str, Any]:
    content = [] if text is None else [text_part(text)]
    return {"type": "message", "id": mid, "role": "assistant", "status": status, "content": content}


def call_item(
    call: dict[str, Any], arguments: str | None = None, status: str = "completed"
) -> dict[str, Any]:
    fn = call["function"]
    return {
        "type": "function_call",
        "id": "fc_" + call["id"].removeprefix("call_"),
        "call_id": call["id"],
        "name": fn["name"],
        "arguments": fn["arguments"] if arguments is None else arguments,
        "status": status,
    }


@dataclass
class ResponseDraft:
    """One response being made: the request's echo fields and the output so far."""

    body: ResponsesRequest
    model: str
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        ending: Ending | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        b = self.body
        incomplete = ending is not None and ending.finish == "length"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status,
            "model": self.model,
            "output": output,
            "instructions": b.instructions,
            "previous_response_id": b.previous_response_id,
            "tools": b.tools or [],
            "tool_choice": b.tool_choice or "auto",
            "parallel_tool_calls": b.parallel_tool_calls is not False,
            "temperature": b.temperature,
            "top_p": b.top_p,
            "max_output_tokens": b.max_output_tokens,
            "text": b.text or {"format": {"type": "text"}},
            "metadata": b.metadata or {},
            "store": b.store,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "usage": usage(ending) if ending is not None else None,
        }


def final_status(ending: Ending) -> str:
    return "incomplete" if ending.finish == "length" else "completed"


def output_items(reasoning: str, content: str, ending: Ending) -> list[dict[str, Any]]:
    """The output of a whole answer; a message item unless the answer is only tool calls."""
    status = final_status(ending)
    items = [reasoning_item(new_id("rs"), reasoning)] if reasoning else []
    if content or not ending.calls:
        items.append(message_item(new_id("msg"), content, status))
    items += [call_item(c) for c in ending.calls]
    return items


def history_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output as chat messages, to store for a follow-up (reasoning is not replayed)."""
    text = "".join(p["text"] for i in output if i["type"] == "message" for p in i["content"])
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in output
        if i["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return [message]


class EventWriter:
    """Numbers the stream's events and frames them as SSE with an `event:` line."""

    def __init__(self) -> None:
        self.seq = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        obj = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return sse(obj, event=kind)
