"""Sampling many sequences at once on the host: top-k, top-p, min-p, temperature, a seeded draw.

llama.cpp's sampler chain copies the whole vocabulary into a candidate array for every sequence
and partially sorts it (~0.15 ms for SmolLM2's 49,152 tokens, one sequence after another). Here the
rows of a step are read in place as one matrix, and a sequence's candidates are only the tokens that
can be in its top-k: the row is cut into n_vocab / 64 groups of 64 tokens, and a token among the k
largest of the row lies in a group whose maximum is among the k largest group maxima, so those k
groups' tokens at or above the k-th largest group maximum (at least k of them) hold the top-k
exactly. The chain then
runs as llama.cpp's does (llama-sampler.cpp: top-k sorts, top-p keeps the shortest prefix whose
softmax mass reaches p, min-p keeps logits >= max + log(min_p), temperature divides, and the draw
picks the first token whose running probability reaches a uniform double), vectorised over all the
rows, on the candidates only. Same distribution; the draw's uniform numbers come from a numpy
generator seeded by the request's seed, so a seeded request repeats itself (not llama.cpp's
mt19937 sequence: the tokens of a seed differ from the native chain's).

Only chains this can do exactly qualify (`HostSampler.sequence`): temperature > 0, 0 < top-k <=
MAX_TOP_K, no typical-p, grammar nor penalties. Logit biases are exact too: a ban (-inf, as
ignore_eos sets, and the API makes of OpenAI's -100) drops its token from the candidates, and a
finite bias (+5 to favour a token, -10 to discourage one) makes its token a candidate at its biased
logit, whatever the group maxima say; one more group is kept per biased or banned token, since
each can push at most one other token out of the row's top-k or let one in.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from outpost.engine.logits import row_address
from outpost.messages import SamplingParams

__all__ = ["MAX_TOP_K", "HostSampler", "HostSequence"]

BLOCK = 16  # tokens per group: 3,072 groups for a 49,152-token vocabulary
MAX_TOP_K = 256  # beyond it the candidate groups cost as much as the native chain's sort
F32 = npt.NDArray[np.float32]
I64 = npt.NDArray[np.int64]


@dataclass
class HostSequence:
    """One request's chain as numbers, and the generator its draws come from."""

    top_k: int
    top_p: float
    log_min_p: float  # -inf: min-p off
    temperature: float
    banned: I64
    rng: np.random.Generator
    bias_ids: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bias_values: F32 = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    special: I64 = field(init=False)  # banned or biased: the tokens whose logits are not the model's

    def __post_init__(self) -> None:
        self.special = np.concatenate([self.banned, self.bias_ids])  # once, not every step

    @property
    def width(self) -> int:
        """Blocks kept: one per top-k token, one more per banned or biased token that might be
        among them (or push one out)."""
        return self.top_k + len(self.banned) + len(self.bias_ids)


class HostSampler:
    """Samples the rows of one step for many `HostSequence`s at once (engine thread only)."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        # A small vocabulary has too few groups for a large k; its tokens are their own groups.
        self.block = BLOCK if n_vocab >= 2 * BLOCK * MAX_TOP_K else 1
        self.n_blocks = n_vocab // self.block

    def sequence(self, params: SamplingParams, eog_ids: frozenset[int], seed: int) -> HostSequence | None:
        """The chain in this sampler's terms, or None where only llama.cpp's native chain is exact.
        seed: the request's (or one drawn for it), for its draws."""
        biases = dict(params.logit_bias)  # a token given twice: the last one counts, as natively
        if params.ignore_eos:
            biases.update(dict.fromkeys(eog_ids, float("-inf")))
        biases = {t: b for t, b in biases.items() if 0 <= t < self.n_vocab and b != 0.0}
        bans = sorted(t for t, b in biases.items() if b == float("-inf"))
        biased = sorted(t for t, b in biases.items() if math.isfinite(b))
        simple = (
            params.temperature > 0.0
            and 0 < params.top_k <= MAX_TOP_K
            and not 0.0 < params.typical_p < 1.0
            and not params.grammar
            and params.repeat_penalty == 1.0
            and params.frequency_penalty == 0.0
            and params.presence_penalty == 0.0
            and len(bans) + len(biased) == len(biases)  # no +inf nor NaN
            and len(biases) <= MAX_TOP_K
        )
        if not simple or params.top_k + len(biases) > self.n_blocks:
            return None
        return HostSequence(
            top_k=params.top_k,
            top_p=params.top_p if 0.0 < params.top_p < 1.0 else 1.0,
            log_min_p=math.log(params.min_p) if params.min_p > 0.0 else float("-inf"),
            temperature=params.temperature,
            banned=np.array(bans, dtype=np.int64),
            rng=np.random.default_rng(seed),
            bias_ids=np.array(biased, dtype=np.int64),
            bias_values=np.array([biases[t] for t in biased], dtype=np.float32),
        )

    def sample(self, ctx: Any, picks: Sequence[tuple[HostSequence, int]]) -> list[int]:
        """One token for each (sequence, batch index) of the last decode, in order."""
        if not picks:
            return []
        logits = self._rows(ctx, [index for _, index in picks])
        return self.sample_rows(logits, [seq for seq, _ in picks])

    def sample_rows(self, logits: F32, seqs: list[HostSequence]) -> list[int]:
        """One token per row of `logits` (n, n_vocab), row i for seqs[i]; draws from each."""
        values, ids = self.top_k(logits, seqs)
        return self._draw(values, ids, seqs)

    def _rows(self, ctx: Any, indices: list[int]) -> F32:
        """The rows as one (n, n_vocab) matrix: a view when they lie back to back in llama.cpp's
        output buffer (every row of a plain decode step does), else a copy of each."""
        addresses = [row_address(ctx, index) for index in indices]
        stride = self.n_vocab * 4
        base = addresses[0]
        if all(a == base + i * stride for i, a in enumerate(addresses)):
            return _floats_at(base, self.n_vocab * len(indices)).reshape(len(indices), self.n_vocab)
        return np.stack([_floats_at(a, self.n_vocab) for a in addresses])

    def top_k(self, logits: F32, seqs: list[HostSequence]) -> tuple[F32, I64]:
        """Each row's top-k logits, sorted descending, and their token ids: (n, max k) arrays
        padded with -inf where a sequence's k is smaller."""
        n = len(seqs)
        row, vals, tok = self._candidates(logits, seqs)
        if any(seq.special.size for seq in seqs):
            row, vals, tok = self._with_biases(logits, seqs, (row, vals, tok))
        order = np.lexsort((-vals, row))  # by row, then logit descending
        row, vals, tok = row[order], vals[order], tok[order]
        rank = np.arange(len(row)) - np.searchsorted(row, np.arange(n))[row]
        k = np.array([s.top_k for s in seqs])
        inside = rank < k[row]
        values = np.full((n, int(k.max())), -np.inf, dtype=np.float32)
        ids = np.zeros(values.shape, dtype=np.int64)
        values[row[inside], rank[inside]] = vals[inside]
        ids[row[inside], rank[inside]] = tok[inside]
        return values, ids

    def _with_biases(
        self, logits: F32, seqs: list[HostSequence], cands: tuple[I64, F32, I64]
    ) -> tuple[I64, F32, I64]:
        """The candidates less every banned or biased token (one pass over all rows, keyed (row,
        token) as row * n_vocab + token), plus each biased token at its biased logit."""
        row, vals, tok = cands
        special = np.concatenate([i * self.n_vocab + s.special for i, s in enumerate(seqs)])
        allowed = ~np.isin(row * self.n_vocab + tok, special)
        row, vals, tok = row[allowed], vals[allowed], tok[allowed]
        biased = [(i, s) for i, s in enumerate(seqs) if s.bias_ids.size]
        if not biased:
            return row, vals, tok
        b_row = np.concatenate([np.full(s.bias_ids.size, i, dtype=np.int64) for i, s in biased])
        b_tok = np.concatenate([s.bias_ids for _, s in biased])
        b_vals = logits[b_row, b_tok] + np.concatenate([s.bias_values for _, s in biased])
        return (
            np.concatenate([row, b_row]),
            np.concatenate([vals, b_vals.astype(np.float32)]),
            np.concatenate([tok, b_tok]),
        )

    def _candidates(self, logits: F32, seqs: list[HostSequence]) -> tuple[I64, F32, I64]:
        """(row, logit, token) of every token at or above its row's threshold: a superset of
        each row's top `width` tokens, unordered."""
        n = len(seqs)
        nb, block = self.n_blocks, self.block
        # Group b holds tokens b, b + nb, b + 2 nb, ...: its maxima are an elementwise maximum of `block`
        # contiguous stretches of the row (vectorised), where a contiguous block's would not be.
        groups = logits[:, : nb * block].reshape(n, block, nb)
        block_max = groups.max(axis=1)
        widths = np.array([s.width for s in seqs])
        w = int(widths.max())
        top_blocks = np.argpartition(block_max, nb - w, axis=1)[:, nb - w :]
        top_max = -np.sort(-np.take_along_axis(block_max, top_blocks, axis=1), axis=1)
        threshold = top_max[np.arange(n), widths - 1]  # the width-th largest block maximum
        cand = groups[np.arange(n)[:, None], :, top_blocks].reshape(n, w * block)
        if nb * block < self.n_vocab:  # the tokens past the last whole group: always candidates
            cand = np.concatenate([cand, logits[:, nb * block :]], axis=1)
        flat = np.flatnonzero(cand >= threshold[:, None])
        row, col = np.divmod(flat, cand.shape[1])
        vals = cand.ravel()[flat]
        in_group = col < w * block
        group, member = np.divmod(np.where(in_group, col, 0), block)
        tok = np.where(in_group, top_blocks[row, group] + member * nb, col - w * block + nb * block)
        return row, vals, tok

    def _draw(self, values: F32, ids: I64, seqs: list[HostSequence]) -> list[int]:
        n, kmax = values.shape
        top = values[:, :1]
        kept = _top_p_lengths(values, top, np.array([s.top_p for s in seqs], dtype=np.float32))
        log_min_p = np.array([s.log_min_p for s in seqs], dtype=np.float32)
        by_min_p = (values >= top + log_min_p[:, None]).sum(axis=1)  # sorted: a prefix
        kept = np.maximum(np.minimum(kept, by_min_p), 1)
        temps = np.array([s.temperature for s in seqs], dtype=np.float32)[:, None]
        scaled = values / temps
        probs = np.exp(scaled - scaled[:, :1]).astype(np.float64)
        probs[np.arange(kmax)[None, :] >= kept[:, None]] = 0.0
        running = np.cumsum(probs, axis=1)
        uniform = np.array([s.rng.random() for s in seqs])
        target = running[:, -1] * uniform
        chosen = (running < target[:, None]).sum(axis=1)  # the first whose running sum reaches it
        chosen = np.minimum(chosen, kept - 1)
        return [int(t) for t in ids[np.arange(n), chosen]]


def _floats_at(address: int, count: int) -> F32:
    return np.frombuffer(memoryview((ctypes.c_float * count).from_address(address)), dtype=np.float32)


def _top_p_lengths(values: F32, top: F32, top_p: npt.NDArray[np.float32]) -> npt.NDArray[np.int64]:
    """How many of each sorted row top-p keeps: the shortest prefix whose softmax over the row's
    top-k reaches p (float32 sums, as llama.cpp's), all of it with p >= 1."""
    e = np.exp(values - top)
    probs = e / e.sum(axis=1, keepdims=True)
    reached = np.cumsum(probs, axis=1) >= top_p[:, None]
    lengths = np.where(reached.any(axis=1), reached.argmax(axis=1) + 1, values.shape[1])
    lengths = np.where(top_p >= 1.0, values.shape[1], lengths)
    return np.asarray(lengths, dtype=np.int64)
