"""Typed messages that cross Outpost's layers.

`GenerateRequest` flows down (api or cli -> EngineClient -> scheduler); `TokenEvent` flows back up.
They are plain dataclasses made only of JSON-friendly fields, so the cluster layer can send them
over a broker as they are. Nothing here imports llama.cpp or does I/O.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Literal, get_args


class FinishReason(StrEnum):
    """Why a request ended; the values are what OpenAI clients expect where one exists."""

    STOP = "stop"  # end-of-generation token or a stop string
    LENGTH = "length"  # max_tokens or the end of the context
    ABORT = "abort"  # the caller went away or cancelled
    TIMEOUT = "timeout"  # deadline passed (the server maps it to 504)
    ERROR = "error"  # the engine failed this request; `TokenEvent.error` says why


@dataclass(frozen=True)
class SamplingParams:
    """One sequence's sampler chain, in llama.cpp's terms. temperature <= 0 means greedy."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typical_p: float = 1.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None  # None: a fresh random seed per request
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias); -inf bans a token
    ignore_eos: bool = False
    grammar: str | None = None  # GBNF (llama.cpp grammar) constraining the output, e.g. JSON
    n_probs: int = -1  # -1: no logprobs; 0: the sampled token's logprob; N: plus the top N


SPEC_TYPES = ("none", "ngram-simple", "ngram-mod", "draft")


@dataclass(frozen=True)
class SpecParams:
    """One request's speculative decoding, with llama-server's names (`speculative.type`, ...).

    type: how drafts are made: none, ngram-simple / ngram-mod (looked up in the request's own
    tokens, no extra model) or draft (the server's draft model, `-md`). n_max / n_min: the most
    draft tokens one step verifies, and the fewest worth verifying (shorter drafts are dropped).
    """

    type: str = "none"
    n_max: int = 16
    n_min: int = 0

    def __post_init__(self) -> None:
        if self.type not in SPEC_TYPES:
            raise ValueError(f"speculative type must be one of {', '.join(SPEC_TYPES)} (got {self.type!r})")
        if not 0 <= self.n_min <= self.n_max <= 256:
            raise ValueError(
                "speculative n_min/n_max must satisfy 0 <= n_min <= n_max <= 256 "
                f"(got {self.n_min}/{self.n_max})"
            )

    @property
    def enabled(self) -> bool:
        return self.type != "none" and self.n_max > 0


@dataclass(frozen=True)
class SpecRequest:
    """A request's own speculative settings (llama-server's `speculative.type` / `.n_max` /
    `.n_min` request fields); a None field keeps the engine's."""

    type: str | None = None
    n_max: int | None = None
    n_min: int | None = None

    def __post_init__(self) -> None:
        if self.type is not None and self.type not in SPEC_TYPES:
            raise ValueError(f"speculative.type must be one of {', '.join(SPEC_TYPES)} (got {self.type!r})")
        for name, value in (("n_max", self.n_max), ("n_min", self.n_min)):
            if value is not None and not 0 <= value <= 256:
                raise ValueError(f"speculative.{name} must be between 0 and 256 (got {value})")

    def over(self, base: SpecParams) -> SpecParams:
        """The engine's settings with this request's changes; ValueError if they do not fit."""
        n_max = base.n_max if self.n_max is None else self.n_max
        n_min = min(base.n_min, n_max) if self.n_min is None else self.n_min
        return SpecParams(self.type or base.type, n_max, n_min)


# LoRA adapter settings: (adapter id, scale) for each adapter applied, ids rising, no zero scales
# (`lora_settings`); () applies none. Requests with equal settings may share a decode step.
LoraScales = tuple[tuple[int, float], ...]


def lora_settings(pairs: Iterable[tuple[int, float]]) -> LoraScales:
    """The normal form of (id, scale) pairs: the last scale given for an id wins, zero scales go."""
    scales = dict(pairs)
    return tuple((i, float(scales[i])) for i in sorted(scales) if scales[i] != 0.0)


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter the engine loaded (`--lora`), llama-server's `GET /lora-adapters` entry."""

    id: int
    path: str
    scale: float  # the server-wide default, set by the flags and POST /lora-adapters


# One embeddings input: a text, or token ids of the embedding model's vocabulary (OpenAI allows both).
EmbedInput = str | list[int]


@dataclass(frozen=True)
class FimTokens:
    """A model's fill-in-the-middle token ids (llama_vocab_fim_*); -1 where the model has none."""

    pre: int = -1
    suf: int = -1
    mid: int = -1
    rep: int = -1
    sep: int = -1

    def missing(self) -> list[str]:
        """What infill needs and this model lacks, in llama-server's words."""
        need = {"prefix": self.pre, "suffix": self.suf, "middle": self.mid}
        return [f"{name} token is missing." for name, tok in need.items() if tok < 0]


@dataclass
class GenerateRequest:
    """A validated, tokenized request: everything the engine needs and nothing HTTP-specific."""

    prompt_tokens: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: tuple[str, ...] = ()
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # Seconds on time.monotonic()'s clock; None: no deadline.
    deadline: float | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    # A resumed request (a cluster worker took it over): its last `n_resumed` prompt tokens are
    # output the client already has. They count against max_tokens (the answer's whole budget)
    # and prime the stop-string and UTF-8 hold-back, so the text goes on as if never interrupted.
    n_resumed: int = 0
    # Speculative decoding for this request; None: the engine's default (serve's --spec-type).
    speculative: SpecRequest | None = None
    # The slot (sequence id) the request must run in, as llama-server's `id_slot`; -1: any. It waits
    # for that slot if it is busy, and is never moved out of it.
    slot: int = -1
    # llama-server's `return_progress`: an event after each prompt chunk is read (`TokenEvent.progress`).
    progress: bool = False
    # llama-server's per-request `lora`: the adapter settings it decodes under (adapters it does not
    # name: scale 0). None: the server's defaults at submission (its flags, POST /lora-adapters).
    lora: LoraScales | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one generated token, and the most likely alternatives at that step."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), most likely first


@dataclass
class Timings:
    """Per-request timings with llama-server's names (milliseconds, tokens/s), plus cache and queue."""

    prompt_n: int = 0  # prompt tokens actually evaluated (cache hits excluded)
    prompt_ms: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    cache_n: int = 0  # prompt tokens reused from the KV cache
    queue_ms: float = 0.0
    draft_n: int = 0  # draft tokens verified (speculative decoding)
    draft_n_accepted: int = 0  # of which the target model accepted
    draft_steps: int = 0  # verifications of a draft (llama-server's n_draft_verif_steps)

    @property
    def prompt_per_second(self) -> float:
        return self.prompt_n / self.prompt_ms * 1000.0 if self.prompt_ms > 0 else 0.0

    @property
    def predicted_per_second(self) -> float:
        return self.predicted_n / self.predicted_ms * 1000.0 if self.predicted_ms > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "prompt_n": self.prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": self.prompt_ms / self.prompt_n if self.prompt_n else 0.0,
            "prompt_per_second": self.prompt_per_second,
            "predicted_n": self.predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": self.predicted_ms / self.predicted_n if self.predicted_n else 0.0,
            "predicted_per_second": self.predicted_per_second,
            "cache_n": self.cache_n,
            "queue_ms": self.queue_ms,
            **self.draft_dict(),
        }

    def draft_dict(self) -> dict[str, float | int]:
        """llama-server's draft fields, present only where the request speculated (as there)."""
        if not self.draft_n:
            return {}
        rate = self.draft_n_accepted / self.draft_n
        return {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted, "draft_acceptance": rate}


@dataclass(frozen=True)
class PromptProgress:
    """How far the prompt has been read, in llama-server's `prompt_progress` terms (tokens, ms)."""

    total: int
    cache: int  # reused from the KV cache
    processed: int  # in the KV now, the cached ones included
    time_ms: float  # since the request took its slot

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)


@dataclass
class TokenEvent:
    """What the engine says about one request after a step: new tokens and text, or the end of it.

    `text` is safe to show: never half a UTF-8 character, never the start of a stop string that
    may still complete. The last event of a request has `finish_reason` set and carries `timings`.
    """

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    timings: Timings | None = None
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them
    # Set on an ERROR that is the request's fault, not the engine's: a cluster worker whose context
    # cannot hold the request after the gateway accepted it. The API answers it as the 400
    # `context_length_exceeded` naming this parameter, as serve does before accepting.
    error_param: str | None = None
    error_counts: tuple[int, int] | None = None  # with error_param: (prompt tokens, context size)
    # Set on an ERROR that is "not now" rather than a failure (a cluster worker's model could not
    # load within its wait): the API answers 503 with this Retry-After, as serve does before accepting.
    error_retry_after: float | None = None
    slot: int = -1  # on the last event: the slot whose KV the request ended in (-1: none)
    progress: PromptProgress | None = None  # a prompt chunk read (requests that asked for it)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class QueueFull(Exception):
    """The waiting queue is at its bound; the server answers 429 with Retry-After."""


class RequestRejected(ValueError):
    """A request the engine can never serve as asked (e.g. longer than the context); a 400.
    `param`: the request field at fault, where one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ContextExceeded(RequestRejected):
    """A request longer than the context one request may use; `param` is the field to change."""

    def __init__(self, message: str, param: str, n_prompt: int = 0, n_ctx: int = 0) -> None:
        super().__init__(message)
        self.param = param
        self.n_prompt = n_prompt  # llama-server's n_prompt_tokens and n_ctx, in its error reply
        self.n_ctx = n_ctx


def context_exceeded(
    n_prompt: int,
    max_tokens: int | None,
    n_ctx_seq: int,
    param: str = "max_tokens",
    prompt_param: str | None = None,
) -> ContextExceeded | None:
    """The refusal of a prompt (+ max_tokens, when given) beyond `n_ctx_seq` positions, or None.

    One wording for every layer that checks it: serve's API before accepting, and a cluster
    worker that turns out smaller than its gateway believed (the client sees the same 400).
    `param` and `prompt_param` are what the client's protocol calls the output budget and the prompt."""
    if prompt_param is None:
        prompt_param = "messages" if param != "max_new_tokens" else "inputs"
    room = n_ctx_seq - n_prompt
    if room < 1:
        return ContextExceeded(
            f"the prompt has {n_prompt} tokens but this server's context holds {n_ctx_seq} tokens "
            "per request (prompt + output): shorten the prompt",
            prompt_param,
            n_prompt,
            n_ctx_seq,
        )
    if max_tokens is not None and max_tokens >= 1 and n_prompt + max_tokens > n_ctx_seq:
        return ContextExceeded(
            f"this server's context holds {n_ctx_seq} tokens per request; the prompt has {n_prompt} "
            f"and {param} asks for {max_tokens} more: lower {param} to at most {room} or shorten the prompt",
            param,
            n_prompt,
            n_ctx_seq,
        )
    return None


class BackendUnavailable(RuntimeError):
    """The backend cannot take requests now (stopping, broker unreachable): a 503 with Retry-After."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ChatTemplateError(ValueError):
    """The model has no usable chat template, or it failed on these messages (a 400)."""


@dataclass(frozen=True)
class SlotAction:
    """llama-server's `POST /slots/{id}?action=`: save a slot's KV (and its tokens) to `filename` in
    the server's slot folder, restore it from there, or erase it."""

    action: Literal["save", "restore", "erase"]
    id_slot: int
    filename: str = ""


@dataclass(frozen=True)
class SlotResult:
    """What a slot action did: tokens saved / restored / erased, file bytes, milliseconds."""

    n_tokens: int
    n_bytes: int = 0
    ms: float = 0.0


SlotRefusal = Literal["disabled", "unsupported", "unknown_slot", "busy", "file"]

# llama-server's -sm values (llama.h's llama_split_mode, in its order); every flag that takes one
# offers these.
SplitMode = Literal["none", "layer", "row", "tensor"]
SPLIT_MODES: tuple[str, ...] = get_args(SplitMode)


class SlotActionError(Exception):
    """A slot action that cannot be done; `reason` says why (the API picks the status from it)."""

    def __init__(self, message: str, reason: SlotRefusal) -> None:
        super().__init__(message)
        self.reason = reason


class NotSupported(Exception):
    """Something this server does not offer as started (reranking without a reranker, a route a
    gateway cannot serve): llama-server's `not_supported_error`, a 501."""
