"""Which prompt tokens a step reads: the prefill budget, one whole short prompt past it, prompt
waves, and the prompt chunks of one group of LoRA settings within the free KV cells (idle caches
evicted, least recently used first, to make room). The scheduler (`scheduler.py`) calls these once
per step, after the decode tokens are placed.

Serial prompts (`SchedulerConfig.serial_prompts`, the CPU's setting). On a CPU a prompt token
costs about the same in a chunk of 100 as in one of 500 (the step is compute-bound past a few
dozen tokens), so reading prompts one after another rather than several in one step costs little
throughput (a pass over the weights per prompt) and brings their first tokens a step apart:
a step reads its first prompt whole if it is short (or all the room the step has, with nothing
generating), and more prompts only within the prefill budget. On a GPU a prompt token costs a
small fraction of a step, so short prompts share steps as before.

Prompt waves (`SchedulerConfig.prompt_waves`). Every prompt read while a stream generates lengthens
that stream's gaps; a prompt read after the stream ended costs it nothing. Requests that end
within a few steps of each other (a closed loop of clients, a batch job with one max_tokens) are
the case worth waiting for: a new prompt waits while a quarter of the generating requests, and
PROMPT_WAVE_MIN at least, will end within `prompt_waves` steps (by max_tokens or the context end; an
end-of-generation token may come sooner), at most PROMPT_WAVE_HOLD times that many steps in all, so
the requests that end together start together again instead of drifting apart, each new prompt
read beside the rest's. One stream of many about to end is no wave: with mixed lengths there nearly
always is one. Nor are a few: a wave's prompts are read one a step, so its median first token waits
for about half of them, and with few streams the gaps it spares are few (the load it adapts to).
"""

from __future__ import annotations

from outpost.messages import LoraScales
from outpost.scheduler.config import SchedulerConfig
from outpost.scheduler.output import BatchChunk
from outpost.scheduler.request import RequestState
from outpost.scheduler.residency import Residency

# While others generate, a prompt within this many prefill budgets is evaluated whole (see
# prefill_chunks); longer ones go a budget per step.
SHORT_PROMPT_CHUNKS = 4
# A prompt waits for a wave at most this many times `prompt_waves` steps: the bound on what a wave
# may cost a first token (a request ending in 8 steps may be followed by one ending in 8 more).
PROMPT_WAVE_HOLD = 8
# A wave is a quarter of the generating requests ending within the window: with requests of mixed
# lengths one of 16 streams is nearly always about to end, and waiting for it alone delayed first
# tokens for nothing (docs/performance.md); a closed loop's streams end together, all of them.
PROMPT_WAVE_SHARE = 4
# ...and four of them at least. A closed loop of 4 clients on the Intel AMX-fault Xeon (performance.md,
# 2026-12-07): waiting for the other 3 put first tokens at 0.48-0.50 s against 0.37-0.39 s and moved
# ITL by about 1 ms either way (20-22 ms), while at 16 streams the waves' ITL was 61-65 against 70-72.
PROMPT_WAVE_MIN = 4


def prefill_budget(config: SchedulerConfig, decoding: int) -> int:
    """Prompt tokens this step may take: the rest of the step, capped while others generate."""
    budget = config.step_token_budget - decoding
    cap = config.prefill_budget
    return min(budget, cap) if decoding and cap is not None else budget


def wave_coming(sched: Residency) -> bool:
    """At least a PROMPT_WAVE_SHARE-th of the generating requests, and PROMPT_WAVE_MIN of them, will
    end within `prompt_waves` steps (prompt waves on)."""
    window = sched.config.prompt_waves
    if window <= 0:
        return False
    n_ctx_seq = sched.config.n_ctx_seq
    generating = ending = 0
    for state in sched._running:
        if state.prefilled:
            generating += 1
            ending += min(state.budget - state.n_generated, n_ctx_seq - len(state.tokens)) <= window
    return ending >= PROMPT_WAVE_MIN and ending * PROMPT_WAVE_SHARE >= generating


def _waits_for_wave(state: RequestState, config: SchedulerConfig) -> bool:
    """A prompt not yet started waits for the wave, within its bound (counts the step)."""
    if state.scheduled_at is not None or state.wave_steps >= PROMPT_WAVE_HOLD * config.prompt_waves:
        return False
    state.wave_steps += 1
    return True


def prefill_chunks(
    sched: Residency, budget: int, decoding: int, room: int, lora: LoraScales
) -> list[BatchChunk]:
    """Prompt chunks in admission order of the requests under `lora`, within the token budget and
    the free cells.

    With a prefill budget, a short prompt (at most SHORT_PROMPT_CHUNKS budgets: cutting a chat turn
    in chunks would delay its first token by whole steps to spare the streams little) goes whole
    past it while the step has room; with serial prompts only the step's first one does, or takes
    the whole room with nothing generating, and further prompts only fit within the budget (see
    the module docstring)."""
    chunks: list[BatchChunk] = []
    used = decoding  # new cells this step's chunks will take
    free = sched._free_cells() - used
    cap = sched.config.prefill_budget
    serial = sched.config.serial_prompts
    if serial and cap is not None and not decoding:
        budget = min(budget, cap)
    wave: bool | None = None if decoding else False  # decided at the first prompt that could wait
    for state in sched._running:
        if budget <= 0:
            break
        if state.prefilled or state.slot is None or state.awaiting is not None or state.lora != lora:
            continue
        if wave is None:
            wave = wave_coming(sched)
        if wave and _waits_for_wave(state, sched.config):
            continue
        n = min(state.n_uncomputed, budget)
        if _whole_step(state, cap, serial, first=not chunks, decoding=decoding):
            n = min(state.n_uncomputed, room)
        while n > free and (ops := sched._pool.evict_lru()) is not None:
            sched._ops += ops
            free = sched._free_cells() - used
        n = min(n, free)
        if n <= 0:
            break
        start = state.n_cached
        end = start + n
        chunks.append(BatchChunk(state.slot.seq_id, state.tokens[start:end], start, end == len(state.tokens)))
        budget -= n
        room -= n
        used += n
        free -= n
    return chunks


def _whole_step(state: RequestState, cap: int | None, serial: bool, first: bool, decoding: int) -> bool:
    """The prompt may take all the step's room, past the budget: a short one (serially, only the
    step's first), or serially the first one with nothing generating."""
    if cap is None:
        return False
    short = len(state.tokens) <= SHORT_PROMPT_CHUNKS * cap
    if not serial:
        return short
    return first and (short or not decoding)
