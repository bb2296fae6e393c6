"""What a benchmark measures: one record per request, statistics per run, the whole result.

Plain dataclasses handed from the load generator to statistics, reports and plots. Times are
seconds on the client's monotonic clock (`time.perf_counter`), relative to the level's start.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from outpost.bench.config import Mode

# Error keys besides HTTP status codes ("500") and exception class names ("ReadTimeout").
STREAM_ERROR = "stream_error"  # an `{"error": ...}` event inside the stream
INCOMPLETE = "incomplete_stream"  # the stream ended without finish_reason or [DONE]
SHORT_OUTPUT = "short_output"  # stopped before max_tokens although ignore_eos/min_tokens were sent


@dataclass
class RequestRecord:
    """One request as the client saw it. `error` None means it succeeded."""

    index: int
    start_s: float
    input_tokens: int
    max_tokens: int
    ttft_s: float | None = None
    last_token_s: float | None = None  # arrival of the last content chunk, from the request's start
    e2e_s: float | None = None
    chunks: int = 0  # content chunks received (a chunk may carry more than one token)
    usage_output_tokens: int | None = None  # the server's own count (`usage.completion_tokens`)
    prompt_tokens: int | None = None  # the server's own count (`usage.prompt_tokens`)
    # llama.cpp's `timings` (llama-server, Outpost): prompt tokens evaluated, and reused from its cache
    prompt_n: int | None = None
    cache_n: int | None = None
    # speculative decoding (llama-server's and Outpost's `timings.draft_n` / `draft_n_accepted`)
    draft_n: int | None = None
    draft_n_accepted: int | None = None
    finish_reason: str | None = None
    done: bool = False  # `data: [DONE]` arrived
    status: int | None = None
    error: str | None = None
    error_detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def output_tokens(self) -> int:
        """The server's `usage` count when it sent one, else the content chunks."""
        return self.usage_output_tokens if self.usage_output_tokens is not None else self.chunks

    @property
    def itl_s(self) -> float | None:
        """Mean gap between tokens after the first: (last token - first token) / (tokens - 1)."""
        if self.ttft_s is None or self.last_token_s is None or self.output_tokens < 2:
            return None
        return (self.last_token_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def tpot_s(self) -> float | None:
        """Time per output token, the first included: last token time / tokens."""
        if self.last_token_s is None or self.output_tokens < 1:
            return None
        return self.last_token_s / self.output_tokens

    @property
    def output_tok_s(self) -> float | None:
        if not self.e2e_s or self.output_tokens < 1:
            return None
        return self.output_tokens / self.e2e_s


@dataclass(frozen=True)
class Stats:
    """Mean and percentiles of one metric over a run's successful requests (None: no samples)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p95: float | None
    p99: float | None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


@dataclass(frozen=True)
class RunSummary:
    """One server at one level."""

    label: str
    url: str
    model: str
    mode: Mode
    level: float
    requests_ok: int
    errors: int
    errors_by_code: dict[str, int]
    duration_s: float
    output_tok_s: float
    total_tok_s: float
    requests_per_s: float
    ttft_s: Stats
    itl_s: Stats
    tpot_s: Stats
    e2e_s: Stats
    request_output_tok_s: Stats
    input_tokens_mean: float | None
    output_tokens_mean: float | None
    capped: bool  # a --duration level that ran out of its request bound before the time was up
    # Speculative decoding over the run: draft tokens verified and accepted (None: no server count).
    draft_n: int | None = None
    draft_n_accepted: int | None = None

    @property
    def draft_acceptance(self) -> float | None:
        return (
            self.draft_n_accepted / self.draft_n
            if self.draft_n and self.draft_n_accepted is not None
            else None
        )

    @property
    def error_rate(self) -> float:
        total = self.requests_ok + self.errors
        return self.errors / total if total else 0.0

    def summary_entry(self) -> dict[str, Any]:
        """The entry of the stdout summary line, in the shape issue 5 fixes."""
        return {
            "url": self.url,
            self.mode: int(self.level) if self.mode == "concurrency" else self.level,
            "requests_ok": self.requests_ok,
            "errors": self.errors,
            "errors_by_code": dict(self.errors_by_code),
            "output_tok_s": self.output_tok_s,
            "requests_per_s": self.requests_per_s,
            "ttft_s": self.ttft_s.as_dict(),
            "itl_s": self.itl_s.as_dict(),
            "tpot_s": self.tpot_s.as_dict(),
            "e2e_s": self.e2e_s.as_dict(),
            **(
                {
                    "draft_n": self.draft_n,
                    "draft_n_accepted": self.draft_n_accepted,
                    "draft_acceptance": self.draft_acceptance,
                }
                if self.draft_n
                else {}
            ),
        }


@dataclass
class RunResult:
    summary: RunSummary
    records: list[RequestRecord]


@dataclass(frozen=True)
class Accepted:
    """Extension fields a server does not reject: `ignore_eos` and `min_tokens` make output lengths
    as asked; `include_usage` gives the real output token count."""

    ignore_eos: bool
    min_tokens: bool
    include_usage: bool


@dataclass(frozen=True)
class ServerInfo:
    """A server as probed before the run."""

    label: str
    url: str
    model: str
    accepted: Accepted


@dataclass(frozen=True)
class PromptStats:
    """How prompt lengths were obtained: `exact` (the server's /tokenize) or a stated estimate."""

    method: str
    exact: bool
    note: str


@dataclass
class BenchResult:
    servers: list[ServerInfo]
    prompts: PromptStats
    runs: list[RunResult] = field(default_factory=list)
