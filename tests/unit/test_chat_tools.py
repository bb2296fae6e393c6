"""outpost.chat.tools and api.chat_plan: tool checks (400s), history through real templates, grammars."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from outpost.api.errors import ApiError
from outpost.api.pipeline.chat_plan import prepare
from outpost.api.pipeline.schemas import ChatCompletionRequest
from outpost.chat import formats, tools
from outpost.engine.chat_template import ChatTemplate
from outpost.models.tokenizer import CHAT_TEMPLATE as SYNTHETIC

QWEN = (Path(__file__).parent.parent / "data" / "qwen2.5-tools.jinja").read_text()
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "days": {"type": "integer", "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
}
LOOP = [
    {"role": "user", "content": "weather in Oslo?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": -3}'},
]


def _plan(template: str, **body: Any) -> Any:
    req = ChatCompletionRequest.model_validate({"messages": LOOP[:1], **body})
    tpl = ChatTemplate(template)
    return prepare(req, tpl.render, template)


def _error(template: str, **body: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        _plan(template, **body)
    assert info.value.status == 400
    return info.value


def test_native_template_gets_tools_history_and_template_kwargs() -> None:
    plan = _plan(QWEN, messages=LOOP, tools=[WEATHER], chat_template_kwargs={"enable_thinking": False})
    assert plan.tools.fmt.name == "hermes" and plan.grammar is None
    assert '"name": "get_weather"' in plan.prompt and "<tools>" in plan.prompt  # the template's own section
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in plan.prompt
    assert '<|im_start|>user\n<tool_response>\n{"temp": -3}\n</tool_response><|im_end|>' in plan.prompt
    assert plan.prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and not plan.starts_inside


def test_template_without_tool_section_gets_the_generic_prompt() -> None:
    plan = _plan(SYNTHETIC, messages=LOOP, tools=[WEATHER])
    assert plan.tools.fmt.name == "injected"
    assert plan.prompt.startswith("<|im_start|>system\nYou can call these tools")
    assert '{"name": "get_weather", "description": "Weather in a city"' in plan.prompt
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}'
        in plan.prompt
    )
    assert '<|im_start|>user\n<tool_response>\n{"temp": -3}\n</tool_response><|im_end|>' in plan.prompt


def test_tool_choice_none_and_no_tools_leave_the_prompt_alone() -> None:
    plain = _plan(SYNTHETIC)
    assert plain.tools is None and plain.grammar is None
    assert _plan(SYNTHETIC, tools=[WEATHER], tool_choice="none").prompt == plain.prompt


def test_required_and_named_choices_build_grammars() -> None:
    req = _plan(SYNTHETIC, tools=[WEATHER], tool_choice="required")
    assert req.grammar.startswith('root ::= "["') and req.tools.enforced and not req.named
    assert req.finish_reason("stop", True) == "tool_calls"
    named = _plan(
        SYNTHETIC, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    assert named.grammar.startswith("root ::= (call0)") and named.named
    assert named.finish_reason("stop", True) == "stop"  # what OpenAI answers for a forced function
    single = _plan(SYNTHETIC, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    assert single.grammar.startswith("root ::= (call0)")
    assert "([0-7]) space" not in single.grammar  # no minimum: negatives allowed
    assert '"-" [1-9] [0-9]{0,15} | [0-7]' in single.grammar


def test_llama3_grammar_uses_parameters() -> None:
    specs = tools.check_tools([WEATHER])
    text = tools.call_grammar(formats.FORMATS["llama3"], specs, "required", False)
    assert '"\\"parameters\\""' in text and "arguments" not in text


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools.0"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools.0.function.parameters",
        ),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "object", "properties": {"x": {"type": "nope"}}},
                        },
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [LOOP[0], LOOP[2]]}, "messages.1.tool_call_id"),
        (
            {
                "messages": [
                    LOOP[0],
                    {
                        **LOOP[1],
                        "tool_calls": [{**CALL, "function": {"name": "get_weather", "arguments": "{oops"}}],
                    },
                    LOOP[2],
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ],
)
def test_bad_tool_input_is_a_400(body: dict[str, Any], param: str) -> None:
    assert _error(SYNTHETIC, **body).param == param


def test_reasoning_settings() -> None:
    r1 = "{% for m in messages %}{{ m.content }}{% endfor %}<｜Assistant｜><think>\n"
    assert _plan(r1).starts_inside and _plan(r1).think
    off = _plan(r1, reasoning_format="none")
    assert not off.think and not off.starts_inside
    assert _plan(SYNTHETIC).output().message("<think>a</think>b")["reasoning_content"] == "a"


def test_mistral_ids_and_phi4_tools_message() -> None:
    msgs = tools.template_messages(formats.FORMATS["mistral"], [dict(m) for m in LOOP])
    cid = msgs[1]["tool_calls"][0]["id"]
    assert len(cid) == 9 and cid.isalnum() and msgs[2]["tool_call_id"] == cid
    phi = tools.with_tools(
        formats.FORMATS["phi4"], [{"role": "user", "content": "hi"}], tools.check_tools([WEATHER])
    )
    assert phi[0]["role"] == "system" and json.loads(phi[0]["tools"])[0]["name"] == "get_weather"
