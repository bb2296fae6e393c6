"""Verifying a draft on the target's logits: the runner's half of speculative decoding.

A chunk with a draft was decoded with logits at its last real token and at every draft token.
The request's own chain samples at each of those rows in order, exactly as plain decoding would
one step at a time, and the verification stops after the first sampled token that is not the
next draft token (that token is the correction), or after the last row (a bonus token). The
chain so sees the emitted tokens, in order, and nothing else: greedy output is the same as
without speculation, a grammar advances token by token, a seeded RNG draws once per token. With
a deterministic draft this is standard speculative sampling (a draft token d survives with
probability p(d); a rejection draws from p without d).
"""

from __future__ import annotations

from typing import Protocol

from outpost.scheduler.output import BatchChunk, SampledToken


class _Sampler(Protocol):
    def sample_at(self, seq_id: int, index: int) -> SampledToken: ...


def verify_draft(runner: _Sampler, chunk: BatchChunk, first_row: int) -> list[SampledToken]:
    """The accepted draft tokens of `chunk` and the token sampled after them."""
    draft_start = len(chunk.tokens) - chunk.n_draft
    run: list[SampledToken] = []
    for i in range(chunk.n_draft + 1):
        token = runner.sample_at(chunk.seq_id, first_row + i)
        run.append(token)
        if i == chunk.n_draft or token.token != chunk.tokens[draft_start + i]:
            break
    return run
