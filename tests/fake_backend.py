"""The one in-memory `InferenceBackend` of the tests: no model, no thread, scripted admission and events.

It stands behind the API (tests/unit: admission, errors, several models) and behind a cluster
worker (tests/integration: a fleet over a real broker), as `LocalBackend` does in `outpost serve`
and `outpost worker`. `FakeCodec` tokenizes by characters (token id = code point) and renders chat
as `role: content` lines.

`submit` awaits `admit` (an event a test may hold) before deciding, the way a broker publish awaits
its confirm, then raises what `refuse` says, or `ContextExceeded` as `LocalBackend` does for a
request its `n_ctx_seq` cannot hold. A stream then answers one of two scripts:
- `FakeBackend("hello")`: the reply's characters, one per event (paced by the `pace` event);
- `FakeBackend.counting(slots, step_s)`: one token per `step_s`, token i being its position in the
  sequence (so a stream resumed elsewhere must continue with exactly the next positions), LENGTH
  after max_tokens (a resumed request's sent tokens count). Its "KV cache" is the prompts of its
  last `slots` requests (what a worker advertises for prefix routing).
Either ends with ABORT at the next step once the request is aborted (an abort of an earlier run of
the same id, e.g. a worker's before a broker outage, does not end its resumed run). With `hold_at`,
a counting stream holds before the token at that position of the sequence until `gate` is set (its
id in `holding` meanwhile): a test breaks the broker while streams are certainly mid-way.
With `cached`, that many prompt tokens are reported as read from the KV cache (`Timings.cache_n`).
With `fail`, every stream ends at once with an ERROR carrying that text (an engine failure).
With `worker_n_ctx_seq`, it accepts what its `n_ctx_seq` holds but a request beyond that smaller
limit ends at once with the final event a cluster worker sends when it refuses one (a gateway's
race with a smaller worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from outpost.backend import BackendStats, EventStream, InferenceBackend
from outpost.messages import (
    FimTokens,
    FinishReason,
    GenerateRequest,
    LoraAdapter,
    LoraScales,
    NotSupported,
    RequestRejected,
    SlotAction,
    SlotActionError,
    SlotResult,
    Timings,
    TokenEvent,
    context_exceeded,
)

MAX_EMBED_CHARS = 50  # a longer text is "longer than the embedding context"


class FakeCodec:
    n_vocab = 0x110000
    chat_template_source: str | None = "fake"
    fim_tokens = FimTokens()  # none: a test sets FimTokens(...) to serve /infill
    bos_token = -1

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
        self._abort_mark = len(backend.aborted)  # aborts from here on are this run's

    def _aborted(self) -> bool:
        return self.request_id in self._backend.aborted[self._abort_mark :]

    async def _held(self, position: int) -> bool:
        """Waits while the backend holds `position`; False once the request is aborted meanwhile."""
        backend = self._backend
        if backend.hold_at is None or position < backend.hold_at:
            return True
        backend.holding.add(self.request_id)
        try:
            for _ in range(12000):  # bounded: 120 s
                if self._aborted():
                    return False
                if backend.gate.is_set():
                    return True
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(backend.gate.wait(), 0.01)
            raise AssertionError("a test held the backend for too long")
        finally:
            backend.holding.discard(self.request_id)

    def _script(self) -> Iterator[tuple[int, str]]:
        if self._backend.reply is not None:
            for ch in self._backend.reply[: self._request.max_tokens]:
                yield ord(ch), ch
            return
        n = len(self._request.prompt_tokens)
        for i in range(self._request.max_tokens - self._request.n_resumed):
            yield n + i, f"<{n + i}>"

    def _final(self, n: int) -> TokenEvent:
        req = self._request
        if self._backend.reply is None:
            timings = Timings(len(req.prompt_tokens), 1.0, n, 1.0)
            return TokenEvent(self.request_id, finish_reason=FinishReason.LENGTH, timings=timings)
        finish = FinishReason.LENGTH if n == req.max_tokens else FinishReason.STOP
        cached = min(self._backend.cached, len(req.prompt_tokens))
        timings = Timings(prompt_n=len(req.prompt_tokens) - cached, predicted_n=n, cache_n=cached)
        timings.draft_n, timings.draft_n_accepted = self._backend.draft_counts
        return TokenEvent(self.request_id, finish_reason=finish, timings=timings)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        backend = self._backend
        refused = backend.refused_by_worker(self._request)
        if refused is None and backend.fail is not None:
            refused = TokenEvent(self.request_id, finish_reason=FinishReason.ERROR, error=backend.fail)
        if refused is not None:
            self._end()
            yield refused
            return
        n = 0
        for token, text in self._script():
            await backend.pace.wait()
            if backend.step_s:
                await asyncio.sleep(backend.step_s)
            if self._aborted() or not await self._held(token):
                self._end()
                yield TokenEvent(self.request_id, finish_reason=FinishReason.ABORT)
                return
            n += 1
            yield TokenEvent(self.request_id, [token], text)
        self._end()
        yield self._final(n)

    def _end(self) -> None:
        if not self.closed:
            self.closed = True
            self._backend.running -= 1

    async def aclose(self) -> None:
        if not self.closed:
            self._end()
            self._backend.aborted.append(self.request_id)


class FakeBackend:
    def __init__(
        self, reply: str | None = "hello", n_ctx_seq: int = 256, slots: int = 2, step_s: float = 0.0
    ) -> None:
        self.codec = FakeCodec()
        self.n_ctx_seq = n_ctx_seq
        self.reply = reply
        self.slots = slots
        self.step_s = step_s
        self.kv_cells = 4096
        self.admit = asyncio.Event()
        self.admit.set()
        self.pace = asyncio.Event()
        self.pace.set()
        self.refuse: BaseException | None = None
        self.refuse_embed: BaseException | None = None  # what embed() raises instead of vectors
        self.embed_gate: asyncio.Event | None = None  # when given, embeddings wait until it is set
        self.embedded: list[list[str]] = []  # every embed() call's texts, in order
        self.submitted: list[GenerateRequest] = []
        self.aborted: list[str] = []
        self.running = 0
        self.max_running = 0  # the most requests it ever ran at once
        self.worker_n_ctx_seq: int | None = None
        self.fail: str | None = None
        self.cached = 0
        self.closed = False
        self.draft_counts = (0, 0)  # (draft_n, draft_n_accepted) every reply's timings report
        self.hold_at: int | None = None
        self.gate = asyncio.Event()
        self.holding: set[str] = set()

    @classmethod
    def counting(cls, slots: int = 2, step_s: float = 0.01, n_ctx_seq: int = 4096) -> FakeBackend:
        return cls(None, n_ctx_seq, slots, step_s)

    @property
    def started(self) -> list[str]:
        return [r.request_id for r in self.submitted]

    @property
    def prompts(self) -> list[list[int]]:
        return [list(r.prompt_tokens) for r in self.submitted]

    async def submit(self, request: GenerateRequest) -> EventStream:
        await self.admit.wait()
        if self.refuse is not None:
            raise self.refuse
        n_prompt = len(request.prompt_tokens) - request.n_resumed
        exceeded = context_exceeded(n_prompt, request.max_tokens, self.n_ctx_seq)
        if exceeded is not None:
            raise exceeded
        self.submitted.append(request)
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        return FakeStream(self, request)

    def refused_by_worker(self, request: GenerateRequest) -> TokenEvent | None:
        if self.worker_n_ctx_seq is None:
            return None
        n_prompt = len(request.prompt_tokens) - request.n_resumed
        exceeded = context_exceeded(n_prompt, request.max_tokens, self.worker_n_ctx_seq)
        if exceeded is None:
            return None
        return TokenEvent(
            request.request_id,
            finish_reason=FinishReason.ERROR,
            error=str(exceeded),
            error_param=exceeded.param,
            error_counts=(exceeded.n_prompt, exceeded.n_ctx),
        )

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def embed(self, texts: Sequence[str | list[int]]) -> tuple[list[list[float]], int]:
        """[length, index] per text and a token per word; ValueError for a text too long."""
        if self.refuse_embed is not None:
            raise self.refuse_embed
        self.embedded.append(list(texts))
        if self.embed_gate is not None:
            await self.embed_gate.wait()
        for i, text in enumerate(texts):
            if len(text) > MAX_EMBED_CHARS:
                raise ValueError(f"input {i} has {len(text)} characters; the fake holds {MAX_EMBED_CHARS}")
        read = sum(len(t.split()) if isinstance(t, str) else len(t) for t in texts)  # ids: one token each
        return [[float(len(t)), float(i)] for i, t in enumerate(texts)], read

    def stats(self) -> BackendStats:
        return BackendStats(slots_total=self.slots, slots_busy=self.running, kv_cells_total=self.kv_cells)

    def cached_sequences(self) -> list[tuple[int, ...]]:
        return [tuple(r.prompt_tokens) for r in self.submitted[-self.slots :]]

    async def rerank(self, query: str, documents: Sequence[str]) -> tuple[list[float], int]:
        raise NotSupported("This server does not support reranking. Start it with `--reranking`")

    async def slot_action(self, action: SlotAction) -> SlotResult:
        raise SlotActionError(
            "This server does not support slots action. Start it with `--slot-save-path`", "disabled"
        )

    def lora_adapters(self) -> list[LoraAdapter]:
        return []

    def set_lora_scales(self, scales: LoraScales) -> None:
        if scales:
            raise RequestRejected(f"lora: no LoRA adapter has id {scales[0][0]} (none is loaded)", "lora")

    def describe(self) -> dict[str, Any]:
        return {"architecture": "fake"}

    def close(self) -> None:
        self.closed = True


GIB = 2**30


class FakeSource:
    """A model pool's model known before it loads (serving/model_pool.py's `ModelSource`); its load
    builds a FakeBackend (held while `gate` is clear)."""

    def __init__(self, need_gib: float = 1.0, refusal: str | None = None) -> None:
        self.codec = FakeCodec()
        self.n_ctx_seq = 4096
        self.need_bytes = int(need_gib * GIB)
        self.refusal = refusal
        self.loads = 0
        self.backends: list[FakeBackend] = []
        self.gate = threading.Event()
        self.gate.set()

    def facts(self) -> dict[str, Any]:
        return {"architecture": "fake"}

    def load(self) -> InferenceBackend:
        assert self.gate.wait(60), "a test held a load for too long"
        self.loads += 1
        backend = FakeBackend("hello", n_ctx_seq=4096)
        self.backends.append(backend)
        return backend

    def close(self) -> None:
        pass
