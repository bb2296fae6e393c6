"""Thinking text out of the answer: `<think>...</think>` -> `reasoning_content`, incrementally.

Models such as DeepSeek-R1 distills and Qwen3 think first, between `<think>` and `</think>`.
`ThinkSplitter` is fed the answer text as it streams (tags may arrive split across tokens, even
byte by byte) and returns what is reasoning and what is content; only a leading think block counts,
as llama-server does. Templates that open `<think>` in the prompt itself (R1 distills) make the
output start inside the thinking: `starts_inside`. Whatever is still open at the end is reasoning.
"""

from __future__ import annotations

from typing import Literal

OPEN = "<think>"
CLOSE = "</think>"

ReasoningFormat = Literal["auto", "none"]


def prompt_opens_thinking(prompt: str) -> bool:
    """True when the rendered prompt ends inside an open `<think>` (the output continues it)."""
    tail = prompt.rstrip()
    return tail.endswith(OPEN)


def _held_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag` (held back)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """Feeds of answer text in, (reasoning, content) pieces out."""

    def __init__(self, starts_inside: bool = False) -> None:
        self._state = "think" if starts_inside else "start"
        self._buf = ""
        self._after_close = False  # drop the whitespace between </think> and the answer

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning = content = ""
        while True:
            if self._state == "start":
                head = self._buf.lstrip()
                if head.startswith(OPEN):
                    self._buf, self._state = head[len(OPEN) :], "think"
                    continue
                if OPEN.startswith(head):  # perhaps a tag still arriving
                    return reasoning, content
                self._state = "content"
            if self._state == "think":
                end = self._buf.find(CLOSE)
                if end < 0:
                    keep = _held_suffix(self._buf, CLOSE)
                    cut = len(self._buf) - keep
                    reasoning += self._buf[:cut]
                    self._buf = self._buf[cut:]
                    return reasoning, content
                reasoning += self._buf[:end]
                self._buf, self._state, self._after_close = self._buf[end + len(CLOSE) :], "content", True
            if self._after_close:
                self._buf = self._buf.lstrip()
                if not self._buf:
                    return reasoning, content
                self._after_close = False
            content += self._buf
            self._buf = ""
            return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What is held back at the end: an unclosed think block is reasoning."""
        rest, self._buf = self._buf, ""
        if self._state == "think":
            return rest, ""
        return "", rest if not self._after_close else rest.lstrip()


def split_reasoning(text: str, starts_inside: bool = False) -> tuple[str, str]:
    """(reasoning, content) of a whole answer."""
    splitter = ThinkSplitter(starts_inside)
    r1, c1 = splitter.feed(text)
    r2, c2 = splitter.finish()
    return r1 + r2, c1 + c2
