"""Tool-call formats: which one a chat template speaks, and reading calls out of model output.

The format is recognised from the GGUF's chat template text, never from the file name:

- `hermes`: Hermes, Qwen 2.5 and Qwen 3: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`
- `llama3`: Llama 3.1/3.2: a JSON object `{"name": .., "parameters": {..}}`, maybe after `<|python_tag|>`
- `mistral`: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` (or `[TOOL_CALLS]name[ARGS]{..}`)
- `phi4`: Phi-4-mini: `<|tool_call|>[{"name": .., "arguments": {..}}]<|/tool_call|>`
- `generic`: a template that takes `tools` in some other way: tools go to the template, calls are
  read as JSON objects or `<tool_call>` blocks.
- `injected`: a template with no tool section at all (SmolLM2, the synthetic models): the tools are
  described in a system message (`tools.GENERIC_PROMPT`) and the model answers in the `<tool_call>`
  form, which the parser reads like `hermes`.

Every format also accepts a bare JSON call object or array: that is what grammar-enforced calls
emit, and what special tokens the detokenizer does not print leave behind. Output that does not
parse as calls to known tools is plain content: a weak or unknown model never causes an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

FormatName = Literal["hermes", "llama3", "mistral", "phi4", "generic", "injected"]


@dataclass(frozen=True)
class ToolFormat:
    name: FormatName
    markers: tuple[str, ...]  # text that opens a call in free output
    args_key: str = "arguments"  # the key the model is trained to write arguments under
    native: bool = True  # the template renders tools itself


FORMATS: dict[str, ToolFormat] = {
    "hermes": ToolFormat("hermes", ("<tool_call>",)),
    "llama3": ToolFormat("llama3", ("<|python_tag|>",), args_key="parameters"),
    "mistral": ToolFormat("mistral", ("[TOOL_CALLS]",)),
    "phi4": ToolFormat("phi4", ("<|tool_call|>",)),
    "generic": ToolFormat("generic", ("<tool_call>",)),
    "injected": ToolFormat("injected", ("<tool_call>",), native=False),
}


def detect(template: str | None) -> ToolFormat:
    """The tool format a chat template's text speaks."""
    src = template or ""
    if "[TOOL_CALLS]" in src:
        return FORMATS["mistral"]
    if "<|tool_call|>" in src or "<|tool|>" in src:
        return FORMATS["phi4"]
    if "<tool_call>" in src:
        return FORMATS["hermes"]
    if "<|python_tag|>" in src or ("<|start_header_id|>" in src and "tools" in src):
        return FORMATS["llama3"]
    if re.search(r"\btools\b", src):
        return FORMATS["generic"]
    return FORMATS["injected"]


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it


def _decode_json_values(text: str) -> list[Any] | None:
    """Consecutive JSON values in `text` (separated by whitespace, `,` or `;`), or None."""
    decoder = json.JSONDecoder(strict=False)  # models put raw newlines in strings
    values: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i] in " \t\r\n,;":
            i += 1
        if i >= len(text):
            return values
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        values.append(value)


def _as_calls(value: Any, known: set[str]) -> list[Call] | None:
    """Calls from a decoded JSON object/array of `{name, arguments|parameters}`; None if not all are."""
    items = value if isinstance(value, list) else [value]
    calls = []
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("function"), dict):
            item = item["function"]  # OpenAI's own shape, which some models copy
        if not isinstance(item, dict) or item.get("name") not in known:
            return None
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                return None
        if not isinstance(args, dict):
            return None
        calls.append(Call(item["name"], json.dumps(args, ensure_ascii=False)))
    return calls or None


def _json_calls(text: str, known: set[str]) -> list[Call] | None:
    values = _decode_json_values(text.strip())
    if not values:
        return None
    calls: list[Call] = []
    for value in values:
        found = _as_calls(value, known)
        if found is None:
            return None
        calls += found
    return calls


_BLOCKS = {
    "<tool_call>": re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S),
    "<|tool_call|>": re.compile(r"<\|tool_call\|>(.*?)(?:<\|/tool_call\|>|$)", re.S),
}
_MISTRAL_ARGS = re.compile(r"\s*([A-Za-z0-9_.-]+)\[ARGS\]")


def _tagged_calls(text: str, opener: str, known: set[str]) -> tuple[str, list[Call]] | None:
    pattern = _BLOCKS[opener]
    calls: list[Call] = []
    for m in pattern.finditer(text):
        found = _json_calls(m.group(1), known)
        if found is None:
            return None
        calls += found
    if not calls:
        return None
    return pattern.sub("", text).strip(), calls


def _after_marker(text: str, marker: str, known: set[str]) -> tuple[str, list[Call]] | None:
    at = text.find(marker)
    if at < 0:
        return None
    body = text[at + len(marker) :]
    calls = _json_calls(body, known)
    if calls is None and marker == "[TOOL_CALLS]":
        calls = _mistral_named(body, known)
    return (text[:at].strip(), calls) if calls else None


def _mistral_named(body: str, known: set[str]) -> list[Call] | None:
    """Mistral's newer `[TOOL_CALLS]name[ARGS]{...}` (repeated) form."""
    parts = re.split(r"\[TOOL_CALLS\]", body)
    calls = []
    for part in parts:
        m = _MISTRAL_ARGS.match(part)
        if not m:
            return None
        args = _decode_json_values(part[m.end() :])
        if m.group(1) not in known or not args or not isinstance(args[0], dict):
            return None
        calls.append(Call(m.group(1), json.dumps(args[0], ensure_ascii=False)))
    return calls


def parse_calls(fmt: ToolFormat, text: str, known: set[str]) -> tuple[str, list[Call]]:
    """(content, calls) read from a whole answer; no calls when nothing parses as calls to `known`."""
    for marker in fmt.markers:
        opener = marker if marker in _BLOCKS else None
        got = _tagged_calls(text, opener, known) if opener else _after_marker(text, marker, known)
        if got is not None:
            return got
    bare = _json_calls(text, known) if text.lstrip()[:1] in ("{", "[") else None
    if bare:
        return "", bare
    return text, []


def _complete_values(text: str, known: set[str]) -> list[Call]:
    """Calls from the complete JSON values at the start of `text` (an array's items or a run of
    objects), up to the first value that does not decode: the one the length limit cut."""
    decoder = json.JSONDecoder(strict=False)
    i = 1 if text.startswith("[") else 0
    calls: list[Call] = []
    while True:
        while i < len(text) and text[i] in " \t\r\n,;":
            i += 1
        try:
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return calls
        found = _as_calls(value, known)
        if found is None:
            return calls
        calls += found


def salvage_calls(fmt: ToolFormat, text: str, known: set[str]) -> tuple[str, list[Call]]:
    """(content, calls) of an answer cut short (max_tokens): the complete calls, the cut one dropped.

    Used only where `parse_calls` found none: a model repeating calls until the limit must still
    deliver the calls it finished."""
    for marker in fmt.markers:
        at = text.find(marker)
        if at < 0:
            continue
        if marker in _BLOCKS:
            closer = marker.replace("<", "</", 1) if marker == "<tool_call>" else "<|/tool_call|>"
            blocks = re.findall(re.escape(marker) + r"(.*?)" + re.escape(closer), text, re.S)
            calls = [c for b in blocks for c in _complete_values(b.strip(), known)]
        else:
            calls = _complete_values(text[at + len(marker) :].lstrip(), known)
        if calls:
            return text[:at].strip(), calls
    head = text.lstrip()
    if head[:1] in ("{", "["):
        return "", _complete_values(head, known)
    return text, []


def marker_at(fmt: ToolFormat, text: str) -> tuple[int, bool]:
    """(index, complete) of the first call marker in `text`, or of a marker's start at its end.

    Streaming emits content up to that index and holds the rest, so no marker half leaks out;
    (len(text), False) when nothing there could open a call.
    """
    best, complete = len(text), False
    for marker in fmt.markers:
        at = text.find(marker)
        if 0 <= at <= best:
            best, complete = at, True
            continue
        for n in range(min(len(marker) - 1, len(text)), 0, -1):
            if marker.startswith(text[-n:]):
                if len(text) - n < best:
                    best, complete = len(text) - n, False
                break
    return best, complete
