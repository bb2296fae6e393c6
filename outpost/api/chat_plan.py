"""A chat request's tools and reasoning settings -> prompt text, grammar and output reader.

`prepare` takes plain values (the request body, a `render(messages, **kwargs)` callable over the
chat template, the template's source text, the server's reasoning default) and returns a
`ChatPlan`: the rendered prompt, the grammar that enforces `tool_choice` `required` or a named
function (None otherwise), and what the reply needs to read the answer (`output()`) and to name
its finish reason. Bad tool input is a 400 here, before anything is queued.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outpost.api.errors import bad_request
from outpost.api.schemas import ChatCompletionRequest, ChatMessage
from outpost.api.tool_schemas import NamedToolChoice
from outpost.chat import formats, tools
from outpost.chat.output import ChatOutput, ToolCalls
from outpost.chat.reasoning import prompt_opens_thinking
from outpost.messages import SamplingParams

Render = Callable[..., str]
_RESERVED = {"messages", "add_generation_prompt", "tools", "bos_token", "eos_token"}


@dataclass(frozen=True)
class ChatPlan:
    prompt: str
    grammar: str | None = None
    tools: ToolCalls | None = None
    named: bool = False  # tool_choice named one function: OpenAI then finishes with "stop"
    think: bool = True
    starts_inside: bool = False

    def output(self) -> ChatOutput:
        return ChatOutput(self.think, self.starts_inside, self.tools)

    def finish_reason(self, base: str | None, made_calls: bool) -> str | None:
        if made_calls and not self.named and base is not None:
            return "tool_calls"
        return base

    def sampling(self, params: SamplingParams) -> SamplingParams:
        """`params` with the tool-call grammar, which takes the place of response_format's."""
        return params if self.grammar is None else dataclasses.replace(params, grammar=self.grammar)


def _dicts(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    out = []
    for i, m in enumerate(messages):
        try:
            text = m.text()
        except ValueError as exc:
            raise bad_request(str(exc), param=f"messages.{i}.content") from exc
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": text}
        if m.tool_calls:
            d["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        out.append(d)
    return out


def _template_kwargs(body: ChatCompletionRequest) -> dict[str, Any]:
    extra = dict(body.chat_template_kwargs or {})
    bad = sorted(_RESERVED & extra.keys())
    if bad:
        raise bad_request(f"chat_template_kwargs may not set {', '.join(bad)}", param="chat_template_kwargs")
    return extra


def prepare(
    body: ChatCompletionRequest, render: Render, template: str | None, reasoning_default: str = "auto"
) -> ChatPlan:
    extra = _template_kwargs(body)
    messages = _dicts(body.messages)
    fmt = formats.detect(template)
    try:
        specs = tools.check_tools([t.model_dump() for t in body.tools or []])
        raw_choice = body.tool_choice
        choice = tools.check_choice(
            raw_choice.model_dump() if isinstance(raw_choice, NamedToolChoice) else raw_choice, specs
        )
        history = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
        if history:
            messages = tools.template_messages(fmt, messages)
        parallel = body.parallel_tool_calls is not False
        grammar = tools.call_grammar(fmt, specs, choice, parallel) if specs else None
    except tools.ToolError as exc:
        raise bad_request(str(exc), param=exc.param) from exc
    reads_calls = bool(specs) and choice != "none"
    if reads_calls:
        messages = tools.with_tools(fmt, messages, specs)
        if fmt.native:
            extra["tools"] = [s.openai() for s in specs]
    prompt = render(messages, add_generation_prompt=True, **extra)
    reasoning = body.reasoning_format or reasoning_default
    return ChatPlan(
        prompt=prompt,
        grammar=grammar,
        tools=ToolCalls(fmt, frozenset(s.name for s in specs), grammar is not None) if reads_calls else None,
        named=choice.startswith("fn:"),
        think=reasoning != "none",
        starts_inside=reasoning != "none" and prompt_opens_thinking(prompt),
    )
