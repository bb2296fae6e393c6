"""Chat rendering as llama-server does it (issue 26), on the templates models ship: the request's
add_generation_prompt, a final assistant message continued (prefill), enable_thinking passed by
default, reasoning_content kept in history, Llama 3.x's date_string, Firefunction-v2's functions."""

from __future__ import annotations

import datetime
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from outpost.api.errors import ApiError
from outpost.api.pipeline import chat_plan
from outpost.api.pipeline.schemas import ChatCompletionRequest
from outpost.engine.chat_template import ChatTemplate

TEMPLATES = Path(__file__).parent.parent / "data" / "templates"
USER = {"role": "user", "content": "Name a colour."}


def _prompt(template: str, body: dict[str, Any], thinking: bool = True) -> str:
    source = (TEMPLATES / template).read_text() if template.endswith(".jinja") else template
    tmpl = ChatTemplate(source, bos_token="<s>", eos_token="</s>")
    request = ChatCompletionRequest.model_validate(body)
    return chat_plan.prepare(request, partial(tmpl.render), source, "auto", thinking).prompt


CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_final_assistant_message_is_continued_not_closed() -> None:
    prefill = {"messages": [USER, {"role": "assistant", "content": "The colour is"}]}
    assert _prompt(CHATML, prefill).endswith("<|im_start|>assistant\nThe colour is")
    closed = _prompt(CHATML, {**prefill, "continue_final_message": False})
    assert closed.endswith("The colour is<|im_end|>\n<|im_start|>assistant\n")
    as_is = _prompt(CHATML, {**prefill, "add_generation_prompt": False})
    assert as_is.endswith("The colour is<|im_end|>\n")  # Hugging Face's rule: nothing added


def test_add_generation_prompt_false_and_continue_without_an_assistant_turn() -> None:
    assert _prompt(CHATML, {"messages": [USER], "add_generation_prompt": False}).endswith("<|im_end|>\n")
    with pytest.raises(ApiError) as exc:
        _prompt(CHATML, {"messages": [USER], "continue_final_message": True})
    assert exc.value.status == 400 and exc.value.param == "continue_final_message"


def test_qwen3_gets_enable_thinking_and_keeps_reasoning_in_history() -> None:
    on = _prompt("Qwen-Qwen3-0.6B.jinja", {"messages": [USER]})
    assert on.endswith("<|im_start|>assistant\n")  # enable_thinking true: the model opens <think>
    off = _prompt("Qwen-Qwen3-0.6B.jinja", {"messages": [USER]}, thinking=False)  # --reasoning off
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    kwargs = {"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}}
    assert _prompt("Qwen-Qwen3-0.6B.jinja", kwargs) == off  # the request wins over the server
    call = {"id": "c1", "type": "function", "function": {"name": "pick", "arguments": "{}"}}
    history = [
        USER,
        {"role": "assistant", "content": "", "reasoning_content": "I should pick one.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "red"},
    ]
    tools = [{"type": "function", "function": {"name": "pick", "parameters": {"type": "object"}}}]
    prompt = _prompt("Qwen-Qwen3-0.6B.jinja", {"messages": history, "tools": tools})
    assert "<think>\nI should pick one.\n</think>" in prompt


def test_llama3_gets_todays_date_string() -> None:
    prompt = _prompt("meta-llama-Llama-3.2-3B-Instruct.jinja", {"messages": [USER]})
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert f"Today Date: {today}" in prompt and "26 Jul 2024" not in prompt


def test_firefunction_v2_renders_with_functions() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
    plain = _prompt("fireworks-ai-llama-3-firefunction-v2.jinja", {"messages": [USER]})
    assert "Available functions as JSON spec:" in plain and "Today is " in plain
    with_tools = _prompt("fireworks-ai-llama-3-firefunction-v2.jinja", {"messages": [USER], "tools": tools})
    assert '"get_weather"' in with_tools
