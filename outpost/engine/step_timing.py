"""Times llama_decode steps on the loaded model when the engine starts: what `--prefill-budget auto`
is chosen from (the rule is pure: outpost/scheduler/budget.py).

On the engine thread, after warmup and before any request: prompt chunks of CHUNK_SIZES tokens,
each after a one-token decode step, ROUNDS times over, each step in sequence 0 from position 0
with the KV cache cleared after it; the fastest try of each size counts, since another process
taking the core makes a try slower, never faster. Cost: ROUNDS x (two decode steps + 80 prompt
tokens), 0.4-0.5 s with the warmup for a 135M q4_0 model on one core, ~20 ms for the tiny model.
"""

from __future__ import annotations

import time

from outpost.engine.batch import TokenBatch
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.budget import StepTimes, chunk_sizes
from outpost.scheduler.output import BatchChunk

# Around the budgets a CPU ends up with (tens of tokens), small enough to keep startup short.
CHUNK_SIZES = (16, 64)
ROUNDS = 2


def measure_step_times(model: LoadedModel, batch: TokenBatch, rounds: int = ROUNDS) -> StepTimes:
    """The fastest of `rounds` tries of each step; leaves the KV cache empty."""
    sizes = chunk_sizes(min(model.n_batch, model.n_ctx_seq - 1), CHUNK_SIZES)
    token = max(model.vocab.bos, 0)  # which token does not matter to the time; a valid one does
    best = {n: float("inf") for n in (1, *sizes)}
    for _ in range(rounds):
        for n in sizes:  # a decode step before each chunk: it is cheap, and the most disturbed
            best[1] = min(best[1], _timed_step(model, batch, [token]))
            best[n] = min(best[n], _timed_step(model, batch, [token] * n))
    return StepTimes(best[1], tuple((n, best[n]) for n in sizes))


def _timed_step(model: LoadedModel, batch: TokenBatch, tokens: list[int]) -> float:
    """Seconds one llama_decode of `tokens` takes (inf if it fails: never a believable time)."""
    batch.fill([BatchChunk(0, tokens, 0, True)])  # logits for the last token, as a real step has
    started = time.perf_counter()
    status = llama.llama_decode(model.ctx, batch.struct)
    elapsed = time.perf_counter() - started
    # Metadata only: zeroing the buffers too would cost more than the steps being timed.
    llama.llama_memory_clear(model.memory, False)
    return elapsed if status == 0 else float("inf")


# Where speculation's prices are measured: a draft's verification has logits at every position and
# comes after a history, unlike a prompt chunk at position 0. For an f16 135M target (2 threads) a
# draft token costs 0.21-0.27 of a step so timed, 0.13 from prompt chunks; for its q4_1 the two
# agree within this VM's spread (0.45-0.58 against 0.52-0.69). benchmarks/spec/costs.py.
VERIFY_DEPTH = 256
VERIFY_DRAFT = 8
VERIFY_ROUNDS = 3


def measure_verify_times(
    model: LoadedModel, batch: TokenBatch, n_draft: int = VERIFY_DRAFT, rounds: int = VERIFY_ROUNDS
) -> tuple[float, float]:
    """(a one-token step, a step verifying `n_draft` draft tokens), fastest of `rounds` tries each,
    after VERIFY_DEPTH tokens of history (fewer where the context is short); leaves the KV empty.
    inf where a decode fails: never a believable time."""
    depth = max(0, min(VERIFY_DEPTH, model.n_ctx_seq - n_draft - 2))
    token = max(model.vocab.bos, 0)
    step = verify = float("inf")
    try:
        if not read_history(model, batch, depth):
            return step, verify
        for _ in range(rounds):
            step = min(step, timed_at(model, batch, [token], depth, 0))
            if n_draft:
                verify = min(verify, timed_at(model, batch, [token] * (n_draft + 1), depth, n_draft))
        return step, verify
    finally:
        llama.llama_memory_clear(model.memory, False)


def read_history(model: LoadedModel, batch: TokenBatch, depth: int) -> bool:
    """`depth` tokens of history in sequence 0, read as a prompt is (which tokens does not matter to
    a step's time; how many does). False if a decode fails."""
    token = max(model.vocab.bos, 0)
    for start in range(0, depth, model.n_batch):
        batch.fill([BatchChunk(0, [token] * min(model.n_batch, depth - start), start, False)])
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            return False
    return True


def timed_at(model: LoadedModel, batch: TokenBatch, tokens: list[int], pos: int, n_draft: int) -> float:
    """Seconds one decode of `tokens` at `pos` takes, logits at the last n_draft + 1; then gone."""
    batch.fill([BatchChunk(0, tokens, pos, True, n_draft)])
    started = time.perf_counter()
    status = llama.llama_decode(model.ctx, batch.struct)
    elapsed = time.perf_counter() - started
    llama.llama_memory_seq_rm(model.memory, 0, pos, -1)
    return elapsed if status == 0 else float("inf")
