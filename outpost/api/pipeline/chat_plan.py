"""A chat request's tools and reasoning settings -> prompt text, grammar and output reader.

`prepare` takes plain values (the request body, a `render(messages, **kwargs)` callable over the
chat template, the template's source text, the server's reasoning defaults) and returns a
`ChatPlan`: the rendered prompt, the grammar that enforces `tool_choice` `required` or a named
function (None otherwise), and what the reply needs to read the answer (`output()`) and to name
its finish reason. Bad tool input is a 400 here, before anything is queued.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from outpost.api.errors import bad_request
from outpost.api.pipeline.schemas import ChatCompletionRequest, ChatMessage
from outpost.api.pipeline.tool_schemas import NamedToolChoice
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
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        out.append(d)
    return out


def _template_kwargs(body: ChatCompletionRequest, thinking: bool) -> dict[str, Any]:
    """The request's template variables over llama-server's defaults: `enable_thinking` (the
    server's --reasoning), Llama 3.x's `date_string`, Firefunction-v2's `functions`/`datetime`."""
    extra = dict(body.chat_template_kwargs or {})
    if bad := sorted(_RESERVED & extra.keys()):
        raise bad_request(f"chat_template_kwargs may not set {', '.join(bad)}", param="chat_template_kwargs")
    now = datetime.datetime.now()
    tools_json = json.dumps([t.model_dump() for t in body.tools or []], indent=2) if body.tools else ""
    defaults = {
        "enable_thinking": thinking,
        "date_string": now.strftime("%d %b %Y"),
        "functions": tools_json,
        "datetime": now.strftime("%b %d %Y %H:%M:%S GMT"),
    }
    return {**defaults, **extra}


def _prefill(body: ChatCompletionRequest, messages: list[dict[str, Any]]) -> str | None:
    """The final assistant message's text when it is to be continued (llama-server's prefill,
    Hugging Face's continue_final_message), else None: it is then closed like any turn."""
    last_is_assistant = messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls")
    if body.continue_final_message and body.add_generation_prompt:
        raise bad_request(  # llama-server's and Hugging Face's refusal
            "Cannot set both add_generation_prompt and continue_final_message to true.",
            param="continue_final_message",
        )
    roles = [m["role"] for m in messages[-2:]]
    if not body.continue_final_message and roles == ["assistant", "assistant"]:
        message = "Cannot have 2 or more assistant messages at the end of the list."
        raise bad_request(message, param="messages")
    if body.continue_final_message and not last_is_assistant:
        raise bad_request(
            "continue_final_message needs a final assistant message (without tool calls) to continue",
            param="continue_final_message",
        )
    if not last_is_assistant or body.continue_final_message is False:
        return None
    if body.add_generation_prompt is False and body.continue_final_message is None:
        return None  # HF's rule: no generation prompt and no continuation asked: render as is
    return str(messages[-1].get("content") or "")


def prepare(
    body: ChatCompletionRequest,
    render: Render,
    template: str | None,
    reasoning_default: str = "auto",
    thinking: bool = True,
) -> ChatPlan:
    """The prompt, grammar and answer reading for `body`; bad tool input is an ApiError (400).

    A final assistant message is continued (prefill): the turns before it are rendered with the
    generation prompt and its text appended, as llama-server does, so any template continues it."""
    extra = _template_kwargs(body, thinking)
    messages = _dicts(body.messages)
    prefill = _prefill(body, messages)
    if prefill is not None:
        messages = messages[:-1]
    fmt = formats.detect(template)
    try:
        specs = tools.check_tools([t.model_dump() for t in body.tools or []])
        raw_choice = body.tool_choice
        choice = tools.check_choice(
            raw_choice.model_dump() if isinstance(raw_choice, NamedToolChoice) else raw_choice, specs
        )
        if any(m.get("tool_calls") or m["role"] == "tool" for m in messages):  # a history of calls
            messages = tools.template_messages(fmt, messages)
        parallel = body.parallel_tool_calls is not False
        grammar = tools.call_grammar(fmt, specs, choice, parallel) if specs else None
    except tools.ToolError as exc:
        raise bad_request(str(exc), param=exc.param) from exc
    except ValueError as exc:  # the tools' schemas together make no usable grammar
        raise bad_request(f"cannot enforce these tools: {exc}", param="tools") from exc
    reads_calls = bool(specs) and choice != "none"
    if reads_calls:
        messages = tools.with_tools(fmt, messages, specs)
        if fmt.native:
            extra["tools"] = [s.openai() for s in specs]
    generation_prompt = prefill is not None or body.add_generation_prompt is not False
    prompt = render(messages, add_generation_prompt=generation_prompt, **extra)
    if prefill is not None:
        prompt += prefill
    reasoning = body.reasoning_format or reasoning_default
    return ChatPlan(
        prompt=prompt,
        grammar=grammar,
        tools=ToolCalls(fmt, frozenset(s.name for s in specs), grammar is not None) if reads_calls else None,
        named=choice.startswith("fn:"),
        think=reasoning != "none",
        starts_inside=reasoning != "none" and prompt_opens_thinking(prompt),
    )
