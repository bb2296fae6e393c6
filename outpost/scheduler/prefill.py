"""Which prompt tokens a step reads: the prefill budget beside generating streams, and the prompt
chunks of one group of LoRA settings within it and within the free KV cells (idle caches evicted,
least recently used first, to make room). The scheduler (`scheduler.py`) calls these once per step,
after the decode tokens are placed.
"""

from __future__ import annotations

from outpost.messages import LoraScales
from outpost.scheduler.config import SchedulerConfig
from outpost.scheduler.output import BatchChunk
from outpost.scheduler.residency import Residency

# While others generate, a prompt within this many prefill budgets is evaluated whole (see
# prefill_chunks); longer ones go a budget per step.
SHORT_PROMPT_CHUNKS = 4


def prefill_budget(config: SchedulerConfig, decoding: int) -> int:
    """Prompt tokens this step may take: the rest of the step, capped while others generate."""
    budget = config.step_token_budget - decoding
    cap = config.prefill_budget
    return min(budget, cap) if decoding and cap is not None else budget


def prefill_chunks(
    sched: Residency, budget: int, decoding: int, room: int, lora: LoraScales
) -> list[BatchChunk]:
    """Prompt chunks in admission order of the requests under `lora`, within the token budget and
    the free cells.

    A short prompt (at most SHORT_PROMPT_CHUNKS budgets long) goes whole while the step has room,
    even past a capped budget: the cap is for long prompts, and cutting a chat turn in chunks would
    delay its first token by whole steps to spare the streams little."""
    chunks: list[BatchChunk] = []
    used = decoding  # new cells this step's chunks will take
    free = sched._free_cells() - used
    cap = sched.config.prefill_budget if budget < room else None
    for state in sched._running:
        if budget <= 0:
            break
        if state.prefilled or state.slot is None or state.awaiting is not None or state.lora != lora:
            continue
        n = min(state.n_uncomputed, budget)
        if cap is not None and len(state.tokens) <= SHORT_PROMPT_CHUNKS * cap:
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
