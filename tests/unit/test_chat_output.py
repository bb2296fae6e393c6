"""outpost.chat: tool-call formats from templates, calls parsed from canned output, <think> splitting.

Streams are replayed split at every byte position (and one character at a time): what comes out
must equal the whole-answer result, so tags split across tokens never leak.
"""

from __future__ import annotations

import json

import pytest

from outpost.chat import formats
from outpost.chat.output import ChatOutput, ToolCalls
from outpost.chat.reasoning import ThinkSplitter, prompt_opens_thinking, split_reasoning

KNOWN = frozenset({"get_weather", "add"})

# Fragments of real templates' tool sections (enough to be recognised; whole templates are long).
TEMPLATES = {
    "hermes": "{%- if tools %}<tools>{{ tool | tojson }}</tools> ... <tool_call>\\n{{ tool_call | tojson }}",
    "llama3": "<|start_header_id|>ipython<|end_header_id|>{%- if tools is not none %}{{- '<|python_tag|>' }}",
    "mistral": "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]",
    "phi4": "{% if 'tools' in message %}<|tool|>{{ message['tools'] }}<|/tool|>{% endif %}",
    "generic": "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.role }}{% endfor %}",
    "injected": "{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>{% endfor %}",
}

ARGS = '{"city": "Paris"}'
CASES = {
    "hermes": 'Let me look. <tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + "}\n</tool_call>",
    "llama3": '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": 'Let me look. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "phi4": 'Let me look. <|tool_call|>[{"name": "get_weather", "arguments": ' + ARGS + "}]<|/tool_call|>",
    "generic": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "injected": 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": ' + ARGS + "}\n</tool_call>",
}


def _run(out: ChatOutput, pieces: list[str]) -> dict[str, str | list[dict[str, object]]]:
    """Replays a stream and assembles deltas as the openai client does."""
    deltas = [out.feed(p) for p in pieces] + out.finish()
    content = "".join(str(d.get("content", "")) for d in deltas)
    reasoning = "".join(str(d.get("reasoning_content", "")) for d in deltas)
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for tc in d.get("tool_calls", []):
            slot = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
            slot["id"] += tc.get("id", "")
            slot["name"] += tc.get("function", {}).get("name", "")
            slot["arguments"] += tc.get("function", {}).get("arguments", "")
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)]}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_format_is_recognised_from_the_template_text(name: str) -> None:
    assert formats.detect(TEMPLATES[name]).name == name
    assert formats.detect(None).name == "injected"


@pytest.mark.parametrize("name", list(CASES))
def test_each_format_parses_canned_output(name: str) -> None:
    fmt = formats.FORMATS[name]
    content, calls = formats.parse_calls(fmt, CASES[name], set(KNOWN))
    assert calls == [formats.Call("get_weather", '{"city": "Paris"}')]
    assert content.strip() in ("", "Let me look.")


@pytest.mark.parametrize("name", list(CASES))
def test_each_format_streams_calls_split_at_every_byte(name: str) -> None:
    fmt = formats.FORMATS[name]
    text = CASES[name]
    whole = ChatOutput(False, tools=ToolCalls(fmt, KNOWN, False)).message(text)
    assert whole["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert whole["tool_calls"][0]["id"].startswith("call_")
    for cut in range(len(text) + 1):
        got = _run(ChatOutput(False, tools=ToolCalls(fmt, KNOWN, False)), [text[:cut], text[cut:]])
        assert [(c["name"], json.loads(c["arguments"])) for c in got["calls"]] == [
            ("get_weather", {"city": "Paris"})
        ]
        assert str(got["content"]).strip() == (whole["content"] or ""), cut
        assert not any(m in str(got["content"]) for m in ("<tool", "[TOOL", "<|")), cut


def test_parallel_calls_and_mistral_named_form() -> None:
    text = (
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    got = _run(ChatOutput(False, tools=ToolCalls(formats.FORMATS["hermes"], KNOWN, False)), list(text))
    assert [c["name"] for c in got["calls"]] == ["add", "get_weather"]
    assert len({c["id"] for c in got["calls"]}) == 2
    content, calls = formats.parse_calls(
        formats.FORMATS["mistral"], '[TOOL_CALLS]add[ARGS]{"a": 1}[TOOL_CALLS]add[ARGS]{"a": 2}', set(KNOWN)
    )
    assert content == "" and [c.arguments for c in calls] == ['{"a": 1}', '{"a": 2}']


@pytest.mark.parametrize(
    "text",
    [
        "Just an answer, no tools.",
        '<tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call>',
        "<tool_call>{not json</tool_call>",
        '{"answer": 42}',
        "[1, 2, 3]",
        "<tool_call>",
    ],
)
def test_unparseable_calls_degrade_to_content(text: str) -> None:
    for name in CASES:
        tools = ToolCalls(formats.FORMATS[name], KNOWN, False)
        msg = ChatOutput(False, tools=tools).message(text)
        assert msg == {"role": "assistant", "content": text}
        assert _run(ChatOutput(False, tools=tools), list(text))["content"] == text


def test_plain_content_streams_without_waiting_for_the_end() -> None:
    out = ChatOutput(False, tools=ToolCalls(formats.FORMATS["hermes"], KNOWN, False))
    assert out.feed("Hello") == {"content": "Hello"}
    assert out.feed(" wor<tool") == {"content": " wor"}  # a possible marker is held back
    assert out.feed("box>") == {"content": "<toolbox>"}


def test_enforced_calls_are_bare_json() -> None:
    tools = ToolCalls(formats.FORMATS["llama3"], KNOWN, True)
    text = '[{"name": "add", "parameters": {"a": 1, "b": 2}}, {"name": "add", "parameters": {"a": 3}}]'
    got = _run(ChatOutput(True, tools=tools), list(text))
    assert [json.loads(str(c["arguments"])) for c in got["calls"]] == [{"a": 1, "b": 2}, {"a": 3}]
    assert got["content"] == ""


THINK = "<think>\nThe user wants a color.\nApples are red.\n</think>\n\nRed."


@pytest.mark.parametrize("text", [THINK, "  " + THINK, "<think></think>Red.", "No thinking here.", "<thi"])
def test_think_split_at_every_byte_matches_whole(text: str) -> None:
    whole = split_reasoning(text)
    for cut in range(len(text) + 1):
        s = ThinkSplitter()
        a, b, c = s.feed(text[:cut]), s.feed(text[cut:]), s.finish()
        assert (a[0] + b[0] + c[0], a[1] + b[1] + c[1]) == whole, cut
    got = _run(ChatOutput(True), list(text))
    assert (got["reasoning"], got["content"]) == whole


def test_think_results() -> None:
    assert split_reasoning(THINK) == ("\nThe user wants a color.\nApples are red.\n", "Red.")
    assert split_reasoning("No <think>x</think> here") == ("", "No <think>x</think> here")
    assert split_reasoning("still thinking, cut off") == ("", "still thinking, cut off")
    assert split_reasoning("<think>cut off") == ("cut off", "")
    # R1 distills: the prompt opened <think>, the output starts inside it
    assert split_reasoning("weighing it</think>Red.", starts_inside=True) == ("weighing it", "Red.")
    assert prompt_opens_thinking("<|Assistant|><think>\n") and not prompt_opens_thinking("a</think>\n\n")


def test_reasoning_off_keeps_tags_inline_and_reasoning_then_calls() -> None:
    assert ChatOutput(False).message(THINK) == {"role": "assistant", "content": THINK}
    text = '<think>need weather</think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    tools = ToolCalls(formats.FORMATS["hermes"], KNOWN, False)
    msg = ChatOutput(True, tools=tools).message(text)
    assert msg["reasoning_content"] == "need weather" and msg["content"] is None
    assert msg["tool_calls"][0]["function"]["arguments"] == "{}"
