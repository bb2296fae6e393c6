"""Request fields for tool calling and reasoning output, as OpenAI (and llama-server) spell them.

Kept apart from `schemas.py` so that module stays about sampling; the chat request and message
models there use these. Checks that need the whole request (a tool message with no matching
call, a named function that is not among the tools) live in `outpost/chat/tools.py`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)


class FunctionDef(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Body):
    type: Literal["function"]
    function: FunctionDef


class CalledFunction(_Body):
    name: str
    arguments: str = ""


class ToolCall(_Body):
    """A call in an assistant message of the history."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


class FunctionName(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice
# llama-server's names: "deepseek" splits like "auto"; "none" keeps <think> text in the content
ReasoningFormat = Literal["auto", "none", "deepseek"]
