"""Answer text -> OpenAI message fields: `content`, `reasoning_content`, `tool_calls`; whole or streamed.

`ChatOutput` is fed the generated text piece by piece (or all at once) and returns delta dicts
the way OpenAI streams them. Thinking is split off first (`reasoning.py`); the rest is content
until a call marker of the tool format shows up (or the answer opens with `{`/`[`, or calls are
enforced by a grammar): from there the text is held and parsed when the answer ends, so calls
go out as `delta.tool_calls` chunks (id, type and name first, then the arguments in pieces, as
the `openai` client assembles them). Held text that does not parse as calls goes out as content.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

from outpost.chat.formats import Call, ToolFormat, marker_at, parse_calls, salvage_calls
from outpost.chat.reasoning import ThinkSplitter

_log = logging.getLogger("outpost.chat")
ARG_PIECES = 3  # argument chunks per streamed call: clients must join pieces, so send several


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolCalls:
    """What the output knows of the tools: their format and names, and whether calls are forced."""

    fmt: ToolFormat
    known: frozenset[str]
    enforced: bool


class _CallStream:
    def __init__(self, tools: ToolCalls) -> None:
        self._tools = tools
        self._held = ""
        self._capturing = tools.enforced
        self._emitted = False

    def feed(self, text: str) -> str:
        self._held += text
        if self._capturing:
            return ""
        if not self._emitted:
            head = self._held.lstrip()
            if not head:
                return ""
            if head[0] in "{[":
                self._capturing = True
                return ""
        cut, complete = marker_at(self._tools.fmt, self._held)
        out, self._held = self._held[:cut], self._held[cut:]
        self._capturing = complete
        self._emitted = self._emitted or bool(out)
        return out

    def finish(self, truncated: bool) -> tuple[str, list[Call], bool]:
        """(content, calls, whether a cut call was dropped); `truncated`: the answer hit its limit."""
        held, self._held = self._held, ""
        if not held:
            return "", [], False
        known = set(self._tools.known)
        content, calls = parse_calls(self._tools.fmt, held, known)
        if calls or not truncated:
            return content, calls, False
        kept, calls = salvage_calls(self._tools.fmt, held, known)
        return (kept, calls, True) if calls else (content, [], False)


class ChatOutput:
    """Splits one answer into message fields; `think` False keeps `<think>` text in the content."""

    def __init__(self, think: bool, starts_inside: bool = False, tools: ToolCalls | None = None) -> None:
        self._think = ThinkSplitter(starts_inside) if think else None
        self._calls = _CallStream(tools) if tools is not None else None
        self.tool_calls: list[dict[str, Any]] = []
        self.dropped_call = False  # the answer was cut inside a call, which was left out

    def _content(self, text: str) -> str:
        return self._calls.feed(text) if self._calls is not None and text else text

    def feed(self, text: str) -> dict[str, Any]:
        """The delta fields for one piece of text ({} when everything is held back for now)."""
        reasoning, content = self._think.feed(text) if self._think is not None else ("", text)
        return _delta(reasoning, self._content(content))

    def finish(self, truncated: bool = False) -> list[dict[str, Any]]:
        """Deltas for what was held back; tool calls last, one call's pieces after another.

        `truncated`: the answer ended at its token limit; complete calls before a cut one are kept."""
        reasoning, content = self._think.finish() if self._think is not None else ("", "")
        content = self._content(content)
        calls: list[Call] = []
        if self._calls is not None:
            rest, calls, self.dropped_call = self._calls.finish(truncated)
            content += rest
            if self.dropped_call:
                _log.warning(
                    "answer cut at its token limit inside a tool call: %d complete call(s) kept, "
                    "the cut one dropped",
                    len(calls),
                )
        deltas = [_delta(reasoning, content)] if reasoning or content else []
        for index, call in enumerate(calls):
            entry = {
                "id": call_id(),
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            self.tool_calls.append(entry)
            deltas += _call_deltas(index, entry)
        return deltas

    def message(self, text: str, truncated: bool = False) -> dict[str, Any]:
        """The whole `message` of a non-streamed reply."""
        fields = [self.feed(text), *self.finish(truncated)]
        content = "".join(f.get("content", "") for f in fields)
        reasoning = "".join(f.get("reasoning_content", "") for f in fields)
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning:
            msg["reasoning_content"] = reasoning
        if self.tool_calls:
            msg["content"] = content.strip() or None
            msg["tool_calls"] = self.tool_calls
        return msg


def _delta(reasoning: str, content: str) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if reasoning:
        delta["reasoning_content"] = reasoning
    if content:
        delta["content"] = content
    return delta


def _call_deltas(index: int, entry: dict[str, Any]) -> list[dict[str, Any]]:
    args = entry["function"]["arguments"]
    head = {"index": index, "id": entry["id"], "type": "function"}
    deltas = [{"tool_calls": [{**head, "function": {"name": entry["function"]["name"], "arguments": ""}}]}]
    step = max(1, -(-len(args) // ARG_PIECES))
    for at in range(0, len(args), step):
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": args[at : at + step]}}]})
    return deltas
