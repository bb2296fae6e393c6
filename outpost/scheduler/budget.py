"""The prefill budget: how many prompt tokens one step may carry while other requests generate.

Owns the `--prefill-budget` spelling (`auto`, `off` or `0`, a number) and the rule that turns step
times measured when the engine starts into `SchedulerConfig.prefill_budget`. Pure: the engine
measures (`outpost/engine/step_timing.py`), this decides, so the rule is tested with made-up times.

The rule. On a CPU a step lasts as long as its tokens take: with a one-stream decode step of a
seconds and b seconds per prompt token, a chunk of p prompt tokens stretches every generating
stream's next token by p * b. The budget lets a step with a chunk cost at most STEP_MULTIPLE
one-stream decode steps, p = (STEP_MULTIPLE - 1) * a / b, within [floor, n_batch].

Why 3. With D the streams' own decode step (one stream: D = a), the streams' ITL grows
(D + (M - 1) a) / D times and a long prompt's TTFT to 1 + D / ((M - 1) a) times its time alone.
Measured on one core of this project's VM (135M q4_0: a = 12.6-13.5 ms, b = 1.6 ms per prompt
token at the start of a prompt, D = 62-64 ms for 7 streams at depth 150; benchmarks/
prefill_replay.py): M = 2 slows one stream and the prompt 2x each but 7 streams' prompts 5.9x;
M = 3 gives one stream 3x (prompt 1.5x) and 7 streams 1.4x (prompt 3.5x); M = 5 gives 7 streams
1.8x (2.2x) but one stream 5x. The worst slowdown on either side, over 1 to 7 streams, is least
at M = 1 + sqrt(D / a) = 3.2.

Why the floor. llama.cpp's CPU flash attention (on by default) runs a tiled kernel only for
micro-batches of 64 tokens or more (GGML_FA_TILE_Q); smaller ones attend one query row at a time,
which costs little early in a prompt but several times more per token deep into one. Replaying a
2,000-token prompt beside 7 streams on that core (two runs; the machine was shared), budgets of 15
and 32 gave ITL p99 1.0-2.6x that of 64 and TTFT 3.3-6x longer (64: 0.75-1.2 s and 15-24 s; no
cap: 2.7-5.3 s and 10-17 s). So with flash attention the budget is never below 64 tokens (on such
a core the rule's 15 gives way to it); without it, never below MIN_BUDGET.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

# A step with a prompt chunk costs at most this many one-stream decode steps (see above).
STEP_MULTIPLE = 3.0
# llama.cpp's CPU flash attention runs its tiled kernel only for micro-batches of at least this
# many tokens (GGML_FA_TILE_Q); smaller ones attend one query row at a time, which late in a long
# prompt costs several times more per token (see the module docstring). With flash attention on,
# a budget below it would slow the streams and the prompt both.
ATTENTION_TILE = 64
# Never fewer prompt tokens per step otherwise: a long prompt always advances at a useful rate
# (where one prompt token costs a whole decode step, one token per micro-batch, the rule gives 2).
MIN_BUDGET = 8
# When the measurement cannot be believed (a chunk of more tokens no slower than a smaller one,
# non-positive or non-finite times): what the rule gives small CPUs, the attention tile.
FALLBACK_BUDGET = ATTENTION_TILE

Asked = int | Literal["auto", "off"]


def parse_prefill_budget(text: str) -> Asked:
    """argparse type: `auto` (measure), `off` or `0` (no cap), or a whole number of tokens >= 1."""
    word = text.strip().lower()
    if word == "auto":
        return "auto"
    if word == "off":
        return "off"
    try:
        tokens = int(word)
    except ValueError:
        tokens = -1
    if tokens < 0:
        raise argparse.ArgumentTypeError(f"expected auto, off, 0 or a number of tokens, got {text!r}")
    return "off" if tokens == 0 else tokens


@dataclass(frozen=True)
class StepTimes:
    """Seconds llama_decode took on the loaded model: a one-token decode step, and prompt chunks
    of (tokens, seconds), each the fastest of a few tries."""

    decode_s: float
    chunks: tuple[tuple[int, float], ...]

    @property
    def per_token_s(self) -> float:
        """Seconds one more prompt token adds to a step: the least-squares slope over the chunks."""
        if len(self.chunks) < 2:
            return math.nan
        ns = [float(n) for n, _ in self.chunks]
        ts = [t for _, t in self.chunks]
        n_mean, t_mean = sum(ns) / len(ns), sum(ts) / len(ts)
        var = sum((n - n_mean) ** 2 for n in ns)
        if var == 0:
            return math.nan
        return sum((n - n_mean) * (t - t_mean) for n, t in zip(ns, ts, strict=True)) / var

    def believable(self) -> bool:
        """Positive, finite times, and more tokens cost more (a chunk more than the decode step,
        a bigger chunk more than a smaller one): anything else means the machine was too busy,
        or too noisy, while we measured."""
        times = [self.decode_s, *(t for _, t in self.chunks)]
        if not all(math.isfinite(t) and t > 0 for t in times):
            return False
        slope = self.per_token_s
        return math.isfinite(slope) and slope > 0 and self.decode_s < min(times[1:])


@dataclass(frozen=True)
class PrefillBudget:
    """The budget the scheduler runs with, and where it came from (for the log and /health).

    tokens: prompt tokens per step while any request generates; None: no cap (all of n_batch).
    source: measured, fallback (measurement not believable), explicit (a number was given),
        off (asked for no cap), single-slot (nothing else can generate while a prompt is read).
    """

    tokens: int | None
    source: Literal["measured", "fallback", "explicit", "off", "single-slot"]
    times: StepTimes | None = None

    def describe(self) -> str:
        """One phrase for the ready line, e.g. `prefill budget 64 tokens/step while decoding
        (measured: decode 12.6 ms, +1.63 ms/prompt token)`."""
        if self.tokens is None:
            why = "no other slot" if self.source == "single-slot" else "off"
            return f"prefill budget: none ({why})"
        head = f"prefill budget {self.tokens} tokens/step while decoding"
        if self.times is None:
            return f"{head} ({self.source})"
        decode_ms, token_ms = self.times.decode_s * 1e3, self.times.per_token_s * 1e3
        measured = f"decode {decode_ms:.3g} ms, +{token_ms:.3g} ms/prompt token"
        if self.source == "fallback":
            return f"{head} (fallback: measured {measured} is not believable)"
        return f"{head} (measured: {measured})"


def budget_floor(n_ubatch: int, flash_attn: bool) -> int:
    """The smallest budget worth having: ATTENTION_TILE tokens wherever a micro-batch can hold them.

    With flash attention, its tile (see the module docstring). Without it, the same: every step
    reads all the weights once, so a chunk of a few tokens buys the decoding streams little and
    makes a long prompt crawl (a 2,000-token prompt at 17 tokens a step takes ~120 steps). The
    argument stays for what it documents; one token per micro-batch (AMX's layout) has no tile."""
    del flash_attn  # the floor is the same either way (see above)
    return ATTENTION_TILE if n_ubatch >= ATTENTION_TILE else MIN_BUDGET


def choose_prefill_budget(
    times: StepTimes, n_batch: int, floor: int = MIN_BUDGET, multiple: float = STEP_MULTIPLE
) -> PrefillBudget:
    """The budget for `times` (see the module docstring), between `floor` and n_batch."""
    if not times.believable():
        return PrefillBudget(_clamp(FALLBACK_BUDGET, floor, n_batch), "fallback", times)
    tokens = (multiple - 1.0) * times.decode_s / times.per_token_s
    return PrefillBudget(_clamp(int(min(tokens, n_batch)), floor, n_batch), "measured", times)


def resolve_prefill_budget(
    asked: Asked | None, n_slots: int, n_batch: int, floor: int, measure: Callable[[], StepTimes]
) -> PrefillBudget:
    """What `asked` means for this engine; `measure` runs only for `auto` with slots to share.

    None is `off` (what callers that predate `auto` pass)."""
    if asked is None or asked == "off":
        return PrefillBudget(None, "off")
    if asked != "auto":
        return PrefillBudget(asked, "explicit")
    if n_slots == 1:  # a prompt is only ever read while nothing generates: the cap never applies
        return PrefillBudget(None, "single-slot")
    return choose_prefill_budget(measure(), n_batch, floor)


def _clamp(tokens: int, floor: int, n_batch: int) -> int:
    return min(max(tokens, floor), n_batch)


def chunk_sizes(limit: int, wanted: Sequence[int]) -> tuple[int, ...]:
    """The distinct prompt-chunk sizes worth timing where a chunk may hold `limit` tokens."""
    return tuple(sorted({min(n, limit) for n in wanted if min(n, limit) >= 2}))
