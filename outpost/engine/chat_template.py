"""Chat templates: the jinja2 text in a GGUF's `tokenizer.chat_template`, rendered as Hugging Face does.

Templates come from model files, i.e. from strangers: they run in jinja2's immutable sandbox.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from outpost.messages import ChatTemplateError

__all__ = ["ChatTemplate", "ChatTemplateError"]


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # HF's own filter: keeps non-ASCII text readable instead of \u escapes.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A compiled chat template with HF's globals: messages, add_generation_prompt, bos/eos tokens."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(source)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """`extra`: more template variables, e.g. `tools` or Qwen3's `enable_thinking`."""
        variables = {"tools": None, **extra}
        try:
            return self._template.render(
                variables,
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
