"""The scheduler's knobs: slot count, KV size, queue bound, per-step token budgets, prefix cache.

A plain frozen dataclass (the server's pydantic config builds one); `__post_init__` rejects values
the scheduler cannot honour, with messages that say which value to change and how.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outpost.messages import SpecParams


@dataclass(frozen=True)
class SchedulerConfig:
    """How the scheduler shares one llama.cpp context between requests.

    n_slots: concurrent requests; slot i is llama.cpp sequence id i (the context's n_seq_max).
    n_ctx: KV cells in all: the unified cache shared by every slot, or the sum of per-slot streams.
    n_ctx_seq: the most positions one request may use, prompt plus output.
    max_queue: requests allowed to wait beyond the free slots; more raise `QueueFull`.
    step_token_budget: tokens per llama_decode (the context's n_batch): decode tokens first,
        then prompt chunks (chunked prefill).
    prefill_budget: prompt tokens per step while any request is generating (None: all of
        step_token_budget). Why: on a CPU a step lasts as long as its tokens take, so a 512-token
        prompt chunk holds every generating stream's next token for the whole chunk; a smaller
        budget keeps their inter-token latency flat while long prompts arrive (vLLM's
        max_num_batched_tokens). With nothing generating, prompts get the whole step. The engine
        chooses it from step times it measures at start (`budget.py`; serve's default `auto`).
    prefix_cache: reuse KV of earlier requests (same slot, or copied from another slot).
    idle_cache_cells: KV cells that finished requests' caches may keep once a new request is
        admitted; beyond it the least recently used idle caches are dropped. Why not keep them all:
        in llama.cpp's unified cache every decode attends over every cell up to the highest one in
        use, so an idle cache taxes every running request (135M model: 74 -> 61 -> 58 tok/s with
        0, 1, 2 idle 256-token caches). The cache a new request reuses is always kept.
    shared_kv: the slots share one pool of cells (llama.cpp's unified cache). False: each slot has
        its own stream of n_ctx_seq cells, so idle caches cost running requests nothing and are
        kept whatever idle_cache_cells says, and requests are kept in the lowest slot ids
        (admitted to the lowest free one; a long-running request moves down into a gap a finished
        one left), because llama.cpp splits a step's batch at every gap in the busy seq ids.
    copy_min_tokens: the shortest prefix copied from another slot rather than recomputed. With a
        stream per slot a copy moves the whole stream (n_ctx_seq cells), so short prefixes are
        cheaper to evaluate again; in one pool a copy only tags cells (1).
    speculative: the speculative decoding a request gets unless it asks otherwise
        (`GenerateRequest.speculative`; see speculation.py).
    spec_token_cost: what one more token adds to a step, relative to a one-token decode step
        (the engine measures it at start): the price a draft token must be expected to repay.
    draft_model: a draft model is loaded (requests may use the `draft` type).
    draft_token_cost: what one draft model step costs, relative to a one-token target step.
    draft_read_cost: what one more token in a draft model step costs (catching up a history it
        has not read: a new request's prompt), relative to a one-token target step.
    serial_prompts: a step reads at most one short prompt past the prefill budget (the CPU's
        setting: a prompt token costs about the same alone or beside others, see prefill.py).
    prompt_waves: steps; 0 is off. While a quarter of the generating requests (four at least) will
        end within this many steps (max_tokens or the context end), a prompt not yet started waits,
        at most PROMPT_WAVE_HOLD times as many steps, so requests that end together start together
        again (see prefill.py).
    ngram_simple: ngram-simple's n-gram and draft sizes (llama-server's --spec-ngram-simple-size-n
        and -m, whose defaults these are).
    """

    n_slots: int = 4
    n_ctx: int = 8192
    n_ctx_seq: int = 8192
    max_queue: int = 64
    step_token_budget: int = 512
    prefill_budget: int | None = None
    prefix_cache: bool = True
    idle_cache_cells: int = 0
    shared_kv: bool = True
    copy_min_tokens: int = 1
    speculative: SpecParams = field(default_factory=SpecParams)
    spec_token_cost: float = 0.15
    draft_model: bool = False
    draft_token_cost: float = 0.5
    draft_read_cost: float = 0.05
    ngram_simple: tuple[int, int] = (12, 48)
    serial_prompts: bool = False
    prompt_waves: int = 0

    def __post_init__(self) -> None:
        if self.n_slots < 1:
            raise ValueError(f"n_slots must be at least 1 (got {self.n_slots})")
        if self.n_ctx < 2:
            raise ValueError(f"n_ctx must be at least 2 KV cells (got {self.n_ctx})")
        if not 2 <= self.n_ctx_seq <= self.n_ctx:
            raise ValueError(
                f"n_ctx_seq must be between 2 and n_ctx={self.n_ctx} (got {self.n_ctx_seq}): "
                "one request can never use more cells than the whole cache; lower n_ctx_seq "
                "or raise n_ctx"
            )
        if self.prefill_budget is not None and self.prefill_budget < 1:
            raise ValueError(f"prefill_budget must be at least 1 token (got {self.prefill_budget})")
        if self.prompt_waves < 0:
            raise ValueError(f"prompt_waves must be 0 (off) or a number of steps (got {self.prompt_waves})")
        if self.copy_min_tokens < 1:
            raise ValueError(f"copy_min_tokens must be at least 1 (got {self.copy_min_tokens})")
        if not self.spec_token_cost > 0.0:
            raise ValueError(f"spec_token_cost must be above 0 (got {self.spec_token_cost})")
        if self.speculative.type == "draft" and not self.draft_model:
            raise ValueError("speculative type 'draft' needs a draft model (-md/--model-draft)")
        if self.idle_cache_cells < 0:
            raise ValueError(f"idle_cache_cells must be 0 or more (got {self.idle_cache_cells})")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be 0 or more (got {self.max_queue})")
        if self.step_token_budget < self.n_slots:
            # Every generating slot needs its one token per step, or some would starve.
            raise ValueError(
                f"step_token_budget (n_batch) must be at least n_slots={self.n_slots} "
                f"(got {self.step_token_budget}): raise n_batch or lower the slot count"
            )
