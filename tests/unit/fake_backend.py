"""An in-memory `InferenceBackend` for API tests: no model, no thread, scripted admission and events.

`FakeCodec` tokenizes by characters (token id = code point) and renders chat as `role: content`
lines. `FakeBackend.submit` awaits `admit` (an event a test may hold) before deciding, the way a
broker publish awaits its confirm, then raises what `refuse` says or streams `reply` one character
per event.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from outpost.backend import BackendStats, EventStream
from outpost.messages import FinishReason, GenerateRequest, Timings, TokenEvent


class FakeCodec:
    n_vocab = 0x110000
    chat_template_source: str | None = "fake"

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def tokenize_prompt(self, text: str, add_special: bool = True) -> list[int]:
        return self.tokenize(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return "".join(chr(t) for t in tokens)

    def token_piece(self, token: int) -> bytes:
        return chr(token).encode()

    def render_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "


class FakeStream:
    def __init__(self, backend: FakeBackend, request: GenerateRequest) -> None:
        self.request_id = request.request_id
        self._backend = backend
        self._request = request
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        text = self._backend.reply[: self._request.max_tokens]
        for ch in text:
            await self._backend.pace.wait()
            yield TokenEvent(self.request_id, [ord(ch)], ch)
        n = len(text)
        finish = FinishReason.LENGTH if n == self._request.max_tokens else FinishReason.STOP
        timings = Timings(prompt_n=len(self._request.prompt_tokens), predicted_n=n)
        self.closed = True
        yield TokenEvent(self.request_id, finish_reason=finish, timings=timings)

    async def aclose(self) -> None:
        if not self.closed:
            self.closed = True
            self._backend.aborted.append(self.request_id)


class FakeBackend:
    def __init__(self, reply: str = "hello", n_ctx_seq: int = 256) -> None:
        self.codec = FakeCodec()
        self.n_ctx_seq = n_ctx_seq
        self.reply = reply
        self.admit = asyncio.Event()
        self.admit.set()
        self.pace = asyncio.Event()
        self.pace.set()
        self.refuse: BaseException | None = None
        self.refuse_embed: BaseException | None = None  # what embed() raises instead of vectors
        self.embedded: list[list[str]] = []
        self.submitted: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.closed = False

    async def submit(self, request: GenerateRequest) -> EventStream:
        await self.admit.wait()
        if self.refuse is not None:
            raise self.refuse
        self.submitted.append(request)
        return FakeStream(self, request)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        if self.refuse_embed is not None:
            raise self.refuse_embed
        self.embedded.append(texts)
        return [[float(len(t)), 0.0] for t in texts], sum(len(t) for t in texts)

    def stats(self) -> BackendStats:
        return BackendStats(slots_total=2, slots_busy=len(self.submitted) - len(self.aborted))

    def describe(self) -> dict[str, Any]:
        return {"architecture": "fake"}

    def close(self) -> None:
        self.closed = True
