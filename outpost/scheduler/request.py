"""One request's life inside the scheduler: its tokens, progress, text stream and clock readings.

Times are the `now` values the engine loop passes in (time.monotonic() seconds); the scheduler
never reads a clock, which keeps it deterministic under test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from outpost.messages import (
    FinishReason,
    GenerateRequest,
    LoraScales,
    PromptProgress,
    RequestRejected,
    Timings,
    TokenEvent,
)
from outpost.scheduler.slots import Slot
from outpost.scheduler.speculation import SpecState
from outpost.scheduler.textstream import TextStream


@dataclass(eq=False)
class RequestState:
    """A request waiting for a slot or running in one.

    `tokens` is the prompt followed by every token generated so far. While running, the slot's
    `cached` is always a prefix of `tokens`: the part whose KV exists. Prefill evaluates the rest;
    the final prefill chunk samples, and from then on each step evaluates the last sampled token.
    After a preemption the whole of `tokens` is prefilled again (recompute), so the text already
    sent never repeats.

    A resumed request (`req.n_resumed` > 0) starts with its text stream primed by the pieces of
    the output already sent, and may sample `budget` = max_tokens - n_resumed more tokens. Its
    timings are this run's: prompt_n counts the resumed tokens it evaluated again (as after a
    preemption), predicted_n / predicted_ms the tokens it sampled and how long that took.
    """

    req: GenerateRequest
    tokens: list[int]
    text: TextStream
    budget: int  # tokens this run may sample: max_tokens less the output already sent
    slot: Slot | None = None
    prefilled: bool = False  # `tokens` as of admission are all in KV; now one token per step
    n_generated: int = 0  # sampled tokens, the EOG token included
    # (source, n): running, but no prompt chunks until the source request, still prefilling,
    # holds the first n tokens of our prompt in KV; they are then copied in (see sharing.py).
    awaiting: tuple[RequestState, int] | None = field(default=None, repr=False)
    # prompt_n counts every prefill token evaluated (recomputes after preemption included);
    # cache_n is the prefix reused at the latest admission (or copied in after awaiting it).
    timings: Timings = field(default_factory=Timings)
    admitted_at: float | None = None  # first admission
    scheduled_at: float | None = None  # first step with one of its chunks
    first_token_at: float | None = None
    last_token_at: float | None = None
    spec: SpecState | None = None  # speculative decoding, if the request uses it
    wave_steps: int = 0  # steps its prompt waited for a wave (prefill.py)

    @classmethod
    def new(cls, req: GenerateRequest, token_piece: Callable[[int], bytes] | None = None) -> RequestState:
        """The request as admitted; `token_piece` renders a resumed request's sent output."""
        text = TextStream(req.stop)
        if req.n_resumed:
            if token_piece is None:
                raise RequestRejected("this engine cannot resume a request: it has no token pieces")
            text.prime(b"".join(token_piece(t) for t in req.prompt_tokens[-req.n_resumed :]))
        return cls(req, list(req.prompt_tokens), text, req.max_tokens - req.n_resumed)

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def lora(self) -> LoraScales:
        """The LoRA settings it decodes under (the engine resolved the server's defaults)."""
        return self.req.lora or ()

    @property
    def n_cached(self) -> int:
        return len(self.slot.cached) if self.slot is not None else 0

    @property
    def n_uncomputed(self) -> int:
        """Tokens still to evaluate before it can sample (prefill), or 1 while generating.

        An awaited prefix does not count: its source evaluates it (and reserves its cells)."""
        if self.awaiting is not None:
            return len(self.tokens) - max(self.n_cached, self.awaiting[1])
        return len(self.tokens) - self.n_cached

    def penalty_history(self) -> tuple[int, ...]:
        """The tail of its tokens that primes the sampler's penalty window (-1: all of them)."""
        n = self.req.sampling.penalty_last_n
        if n == 0:
            return ()
        return tuple(self.tokens if n < 0 else self.tokens[-n:])

    def on_token(self, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
            if self.scheduled_at is not None:
                self.timings.prompt_ms = _ms(now - self.scheduled_at)
        self.last_token_at = now
        self.n_generated += 1

    def final_event(
        self,
        reason: FinishReason,
        now: float,
        token_ids: list[int],
        text: str,
        error: str | None = None,
    ) -> TokenEvent:
        """The request's last event, with its timings filled in."""
        t = self.timings
        t.queue_ms = _ms((self.admitted_at if self.admitted_at is not None else now) - self.req.arrival_time)
        t.predicted_n = self.n_generated
        if self.first_token_at is not None and self.last_token_at is not None:
            t.predicted_ms = _ms(self.last_token_at - self.first_token_at)
        return TokenEvent(self.request_id, token_ids, text, reason, t, error)


def add_progress(state: RequestState, now: float, events: list[TokenEvent], n_before: int) -> None:
    """llama-server's `prompt_progress` after a prompt chunk (the prompt's tokens now in the slot):
    on the request's event of this step if it has one (one event per request and step), else alone."""
    total = len(state.req.prompt_tokens)
    held = len(state.slot.cached) if state.slot is not None else 0
    since = state.admitted_at if state.admitted_at is not None else now
    read = PromptProgress(total, state.timings.cache_n, min(held, total), _ms(now - since))
    if len(events) > n_before and events[-1].request_id == state.request_id:
        events[-1].progress = read
    else:
        events.append(TokenEvent(state.request_id, progress=read))


def check_admissible(req: GenerateRequest, n_ctx_seq: int) -> None:
    """Raises RequestRejected for a request no engine state could ever serve."""
    n = len(req.prompt_tokens)
    if n == 0:
        raise RequestRejected("the prompt is empty: send at least one token")
    if n >= n_ctx_seq:
        raise RequestRejected(
            f"the prompt has {n} tokens but a request may use {n_ctx_seq} positions (prompt + "
            f"output): shorten the prompt to at most {n_ctx_seq - 1} tokens or raise the context size"
        )
    if req.max_tokens < 1:
        raise RequestRejected(f"max_tokens must be at least 1 (got {req.max_tokens})")
    if not 0 <= req.n_resumed < n:
        raise RequestRejected(f"n_resumed={req.n_resumed} must be below the prompt's {n} tokens")
    if req.n_resumed >= req.max_tokens:
        raise RequestRejected(f"a resumed request with its {req.max_tokens} tokens all sent has no work")


def _ms(seconds: float) -> float:
    return max(0.0, seconds * 1000.0)
