"""Counting prompt tokens: the server's own `/tokenize` when it has one, else a stated estimate.

llama.cpp's server and Outpost take `{"content", "add_special"}`; vLLM and SGLang take `{"model",
"prompt"}`. Either answers `{"tokens": [...]}`. The probe finds which shape works, once.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from outpost.bench.client import BenchError


class TokenCounter(Protocol):
    """Counts the tokens of a piece of prompt text (no BOS or other special tokens)."""

    exact: bool
    method: str

    async def count(self, text: str) -> int: ...


@dataclass
class ServerTokenizer:
    """Counts with the server's `/tokenize`; `shape` is the request body style that worked."""

    client: httpx.AsyncClient
    model: str
    shape: str
    exact: bool = True
    method: str = "tokenize"

    def _body(self, text: str) -> dict[str, Any]:
        if self.shape == "llama.cpp":
            return {"content": text, "add_special": False}
        return {"model": self.model, "prompt": text, "add_special_tokens": False}

    async def count(self, text: str) -> int:
        try:
            r = await self.client.post("/tokenize", json=self._body(text))
        except httpx.HTTPError as exc:
            raise BenchError(
                f"/tokenize failed while preparing prompts: {type(exc).__name__}: {exc}"
            ) from exc
        tokens = _tokens(r)
        if tokens is None:
            raise BenchError(f"/tokenize answered HTTP {r.status_code} while preparing prompts")
        return len(tokens)


class EstimateCounter:
    """No `/tokenize`: one token per word of the built-in common-word list (each is one token in
    the GPT-2, Llama and Qwen vocabularies), one per 4 characters for any other word."""

    exact = False
    method = "estimate"

    def __init__(self, common: frozenset[str]) -> None:
        self.common = common

    async def count(self, text: str) -> int:
        return sum(1 if w in self.common else max(1, math.ceil(len(w) / 4)) for w in text.split())


def _tokens(r: httpx.Response) -> list[Any] | None:
    if r.status_code != 200:
        return None
    try:
        tokens = r.json().get("tokens")
    except ValueError:
        return None
    return tokens if isinstance(tokens, list) else None


async def detect(client: httpx.AsyncClient, model: str, common: frozenset[str]) -> TokenCounter:
    """The server's tokenizer if `/tokenize` answers in either known shape, else the estimate."""
    for shape in ("llama.cpp", "vllm"):
        counter = ServerTokenizer(client, model, shape)
        try:
            r = await client.post("/tokenize", json=counter._body("hello world"))
        except httpx.HTTPError:
            break
        if _tokens(r):
            return counter
    return EstimateCounter(common)


async def single_token_words(counter: TokenCounter, words: list[str], calls: int = 256) -> list[str]:
    """The words that add exactly one token after another word: prompts built from them hit a token
    count exactly. Bisects, so a vocabulary where all words pass costs one call."""
    anchor = "The"
    base = await counter.count(anchor)
    budget = [calls]  # bounds the bisection whatever the tokenizer does

    async def passing(group: list[str]) -> list[str]:
        if not group or budget[0] <= 0:
            return []
        budget[0] -= 1
        if await counter.count(anchor + "".join(" " + w for w in group)) == base + len(group):
            return group
        if len(group) == 1:
            return []
        mid = len(group) // 2
        left, right = await asyncio.gather(passing(group[:mid]), passing(group[mid:]))
        return left + right

    return await passing(words)
