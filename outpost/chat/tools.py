"""The request side of tool calling: checked tools, the history for the template, the call grammar.

Plain values in and out (dicts as the OpenAI API spells them), so this runs without an engine.
`ToolError` carries the `param` of a 400. A template with no tool section gets the tools in a
system message, `GENERIC_PROMPT`, and answers with `<tool_call>{...}</tool_call>` blocks; its
history is rewritten the same way (assistant calls as those blocks, tool results as user turns in
`<tool_response>` blocks), so templates that only know user/assistant/system still render it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from outpost.chat.formats import ToolFormat
from outpost.grammar import GrammarBuilder

MAX_PARALLEL = 8  # calls one enforced answer may hold: bounds what a weak model can ramble
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

GENERIC_PROMPT = """You can call these tools; each line is one tool's JSON description:
{tools}

To call a tool, answer with one block per call and nothing else:
<tool_call>
{{"name": "<tool name>", "arguments": {{<the arguments as a JSON object>}}}}
</tool_call>
Tool results come back in <tool_response> blocks. If no tool is needed, answer normally."""


class ToolError(ValueError):
    """Bad tool input: a 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any]

    def openai(self) -> dict[str, Any]:
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


def check_tools(tools: list[dict[str, Any]]) -> list[ToolSpec]:
    """The request's function tools; a bad name or an unusable parameters schema is a ToolError."""
    specs: list[ToolSpec] = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") or {}
        name = fn.get("name", "")
        if not _NAME.match(name):
            raise ToolError(f"tool name {name!r} must be 1-64 of a-z, A-Z, 0-9, _ and -", f"tools.{i}")
        if any(s.name == name for s in specs):
            raise ToolError(f"two tools are named {name!r}", f"tools.{i}.function.name")
        params = fn.get("parameters")
        params = {"type": "object", "properties": {}} if params is None else params
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise ToolError("a tool's parameters must be an object schema", f"tools.{i}.function.parameters")
        try:
            GrammarBuilder().rule(params, "args")
        except ValueError as exc:
            raise ToolError(f"tool {name!r}: {exc}", f"tools.{i}.function.parameters") from exc
        specs.append(ToolSpec(name, fn.get("description") or "", params))
    return specs


def check_choice(choice: Any, specs: list[ToolSpec]) -> str:
    """'auto' | 'none' | 'required' | the forced function's name (prefixed 'fn:')."""
    if choice is None:
        return "auto" if specs else "none"
    if isinstance(choice, str):
        if choice == "required" and not specs:
            raise ToolError(f"tool_choice {choice!r} needs tools", "tool_choice")
        return choice
    name = (choice.get("function") or {}).get("name")
    if not any(s.name == name for s in specs):
        raise ToolError(f"tool_choice names function {name!r}, which is not among the tools", "tool_choice")
    return f"fn:{name}"


def _mistral_id(call_id: str) -> str:
    """Mistral's templates insist on 9 alphanumeric characters."""
    return hashlib.sha1(call_id.encode()).hexdigest()[:9]


def _arguments(raw: str, param: str) -> dict[str, Any]:
    try:
        args = json.loads(raw or "{}")
    except json.JSONDecodeError as exc:
        raise ToolError(f"tool call arguments are not JSON: {exc}", param) from exc
    if not isinstance(args, dict):
        raise ToolError("tool call arguments must be a JSON object", param)
    return args


def _call_block(name: str, args: dict[str, Any]) -> str:
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _assistant(fmt: ToolFormat, m: dict[str, Any], i: int, names: dict[str, str]) -> dict[str, Any]:
    content = m.get("content") or ""
    calls: list[dict[str, Any]] = []
    for j, call in enumerate(m["tool_calls"]):
        fn = call["function"]
        args = _arguments(fn.get("arguments", ""), f"messages.{i}.tool_calls.{j}.function.arguments")
        names[call["id"]] = fn["name"]
        cid = _mistral_id(call["id"]) if fmt.name == "mistral" else call["id"]
        calls.append({"id": cid, "type": "function", "function": {"name": fn["name"], "arguments": args}})
    if fmt.native:
        return {"role": "assistant", "content": content, "tool_calls": calls}
    blocks = "\n".join(_call_block(c["function"]["name"], c["function"]["arguments"]) for c in calls)
    return {"role": "assistant", "content": (content + "\n" if content else "") + blocks}


def _tool_result(
    fmt: ToolFormat, m: dict[str, Any], i: int, names: dict[str, str], out: list[dict[str, Any]]
) -> None:
    call_id = m.get("tool_call_id")
    if call_id not in names:
        raise ToolError(
            f"this tool message answers tool_call_id {call_id!r}, which no earlier assistant message called",
            f"messages.{i}.tool_call_id",
        )
    content = m.get("content") or ""
    if fmt.native:
        cid = _mistral_id(call_id) if fmt.name == "mistral" else call_id
        out.append({"role": "tool", "content": content, "tool_call_id": cid, "name": names[call_id]})
        return
    block = f"<tool_response>\n{content}\n</tool_response>"
    if out and out[-1]["role"] == "user" and out[-1]["content"].startswith("<tool_response>"):
        out[-1]["content"] += "\n" + block  # results of one turn's calls: one user turn
    else:
        out.append({"role": "user", "content": block})


def template_messages(fmt: ToolFormat, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history as the template expects it; a tool result with no matching call is a ToolError."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # call id -> function name, from earlier assistant turns
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append(_assistant(fmt, m, i, names))
        elif m["role"] == "tool":
            _tool_result(fmt, m, i, names, out)
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
        if m.get("reasoning_content"):  # the turn's thinking, for templates that replay it (Qwen3)
            out[-1] = {**out[-1], "reasoning_content": m["reasoning_content"]}
    return out


def with_tools(
    fmt: ToolFormat, messages: list[dict[str, Any]], specs: list[ToolSpec]
) -> list[dict[str, Any]]:
    """Messages carrying the tools where the template wants them in a message (Phi-4, injected)."""
    if fmt.name == "phi4":
        tools = json.dumps([s.openai()["function"] for s in specs], ensure_ascii=False)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "tools": tools}, *messages[1:]]
        return [
            {"role": "system", "content": "You are a helpful assistant with some tools.", "tools": tools},
            *messages,
        ]
    if fmt.native:
        return messages
    lines = "\n".join(json.dumps(s.openai()["function"], ensure_ascii=False) for s in specs)
    prompt = GENERIC_PROMPT.format(tools=lines)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + prompt}, *messages[1:]]
    return [{"role": "system", "content": prompt}, *messages]


def call_grammar(fmt: ToolFormat, specs: list[ToolSpec], choice: str, parallel: bool) -> str | None:
    """GBNF forcing calls (bare JSON, see formats.py) for 'required' or a named function, else None."""
    if choice in ("auto", "none"):
        return None
    chosen = [s for s in specs if choice == "required" or f"fn:{s.name}" == choice]
    builder = GrammarBuilder()
    alts = []
    for i, spec in enumerate(chosen):
        schema = {
            "type": "object",
            "properties": {"name": {"const": spec.name}, fmt.args_key: spec.parameters},
            "required": ["name", fmt.args_key],
            "additionalProperties": False,
        }
        alts.append(builder.rule(schema, f"call{i}"))
    call = "(" + " | ".join(alts) + ")"
    if not parallel or choice != "required":
        return builder.grammar(call)
    more = f'("," " "? {call}){{0,{MAX_PARALLEL - 1}}}'
    return builder.grammar(f'"[" {call} {more} "]"')
