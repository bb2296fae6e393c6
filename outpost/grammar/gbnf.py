"""GBNF syntax checking: a grammar the API accepts is one llama.cpp's grammar parser accepts.

llama.cpp answers a grammar it cannot parse with a null sampler (and a line on stderr), which the
engine can only report after the request was accepted. This mirrors llama.cpp's
`llama_grammar_parser` (src/llama-grammar.cpp) closely enough to refuse the same inputs up front,
with a message naming the line and the problem: rule definitions `name ::= ...`, literals,
character classes, rule references, groups, `.`, the repetitions `* + ? {m} {m,} {m,n}`, `#`
comments, and that every referenced rule is defined and `root` exists.
"""

from __future__ import annotations

import re

__all__ = ["GrammarSyntaxError", "check_gbnf"]

_NAME = re.compile(r"[A-Za-z0-9-]+")
_ESCAPES = set('nrt\\"[]') | {"x", "u", "U", "/"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class GrammarSyntaxError(ValueError):
    """The grammar does not parse; the message says where and why."""


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.defined: set[str] = set()
        self.used: dict[str, int] = {}

    def fail(self, why: str) -> GrammarSyntaxError:
        line = self.text.count("\n", 0, self.pos) + 1
        near = self.text[self.pos : self.pos + 20].split("\n")[0]
        return GrammarSyntaxError(f"line {line}: {why}" + (f" (at {near!r})" if near else ""))

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def space(self, newlines: bool) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#":
                while self.pos < len(self.text) and self.text[self.pos] not in "\r\n":
                    self.pos += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.pos += 1
            else:
                return

    def name(self) -> str:
        m = _NAME.match(self.text, self.pos)
        if m is None:
            raise self.fail("expected a rule name")
        self.pos = m.end()
        return m.group()

    def char(self, end: str) -> None:
        c = self.peek()
        if not c:
            raise self.fail(f"unexpected end of input: missing closing {end}")
        if c != "\\":
            self.pos += 1
            return
        esc = self.peek(1)
        if esc not in _ESCAPES:
            raise self.fail(f"unknown escape \\{esc}")
        self.pos += 2
        digits = _HEX_DIGITS.get(esc, 0)
        hexpart = self.text[self.pos : self.pos + digits]
        if digits and not re.fullmatch(f"[0-9A-Fa-f]{{{digits}}}", hexpart):
            raise self.fail(f"\\{esc} needs {digits} hex digits")
        self.pos += digits

    def literal(self) -> None:
        self.pos += 1
        while self.peek() != '"':
            if self.peek() in ("", "\n"):
                raise self.fail('unterminated string literal: missing closing "')
            self.char('"')
        self.pos += 1

    def char_class(self) -> None:
        self.pos += 1
        if self.peek() == "^":
            self.pos += 1
        while self.peek() != "]":
            if not self.peek():
                raise self.fail("unterminated character class: missing closing ]")
            self.char("]")
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.pos += 1
                self.char("]")
        self.pos += 1

    def braces(self) -> None:
        m = re.compile(r"\{\s*(\d+)\s*(,\s*(\d*)\s*)?\}").match(self.text, self.pos)
        if m is None:
            raise self.fail("a repetition is {m}, {m,} or {m,n} with whole numbers")
        if m.group(3) and int(m.group(3)) < int(m.group(1)):
            raise self.fail("in {m,n}, n must not be less than m")
        self.pos = m.end()

    def sequence(self, nested: bool) -> None:
        last_ok = False  # whether a repetition operator may follow
        while True:
            c = self.peek()
            if c == '"':
                self.literal()
            elif c == "[":
                self.char_class()
            elif c == ".":
                self.pos += 1
            elif c == "(":
                self.pos += 1
                self.space(True)
                self.alternatives(nested=True)
                if self.peek() != ")":
                    raise self.fail("expected ) to close the group")
                self.pos += 1
            elif c and _NAME.match(c):
                start = self.pos
                self.used.setdefault(self.name(), start)
            elif c and c in "*+?{":
                if not last_ok:
                    raise self.fail(f"{c!r} must follow an item to repeat")
                if c == "{":
                    self.braces()
                else:
                    self.pos += 1
                self.space(nested)
                last_ok = False
                continue
            else:
                return
            last_ok = True
            self.space(nested)

    def alternatives(self, nested: bool) -> None:
        self.sequence(nested)
        while self.peek() == "|":
            self.pos += 1
            self.space(True)
            self.sequence(nested)

    def rule(self) -> None:
        name = self.name()
        self.space(False)
        if self.text[self.pos : self.pos + 3] != "::=":
            raise self.fail(f"expected ::= after the rule name {name!r}")
        self.pos += 3
        self.space(True)
        self.alternatives(nested=False)
        if self.peek() == "\r":
            self.pos += 1
        if self.peek() not in ("\n", ""):
            raise self.fail("expected the end of the rule (a newline)")
        self.defined.add(name)

    def parse(self) -> None:
        self.space(True)
        while self.pos < len(self.text):
            self.rule()
            self.space(True)
        if "root" not in self.defined:
            raise GrammarSyntaxError("the grammar has no 'root' rule (generation starts there)")
        for name, pos in self.used.items():
            if name not in self.defined:
                self.pos = pos
                raise self.fail(f"rule {name!r} is used but never defined")


def check_gbnf(text: str) -> None:
    """Raise GrammarSyntaxError if llama.cpp's parser would refuse `text`."""
    if not text.strip():
        raise GrammarSyntaxError("the grammar is empty")
    _Parser(text).parse()
