"""The host sampler (outpost/engine/host_sampling.py) on logits matrices, no model: its candidates are
each row's exact top-k, its draws follow llama.cpp's chain's distribution (chi-square against an
independent reference of the chain, fixed seeds), a seed repeats itself whatever else is in the
batch, and chains it cannot do exactly are left to llama.cpp."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from outpost.engine.host_sampling import HostSampler, HostSequence
from outpost.messages import SamplingParams

DEFAULTS = SamplingParams(temperature=0.8, top_p=0.95)  # top-k 40, min-p 0.05: what requests get


def chain_probs(
    row: npt.NDArray[np.float32], p: SamplingParams, banned: frozenset[int] = frozenset()
) -> dict[int, float]:
    """llama.cpp's top-k -> top-p -> min-p -> temperature -> dist, by a full sort in float64."""
    logits = row.astype(np.float64).copy()
    logits[list(banned)] = -np.inf
    order = np.argsort(-logits, kind="stable")[: p.top_k]
    vals = logits[order]
    if p.top_p < 1.0:
        soft = np.exp(vals - vals[0])
        cum = np.cumsum(soft / soft.sum())
        vals, order = vals[: int(np.argmax(cum >= p.top_p)) + 1], order[: int(np.argmax(cum >= p.top_p)) + 1]
    if p.min_p > 0.0:
        keep = max(1, int((vals >= vals[0] + math.log(p.min_p)).sum()))
        vals, order = vals[:keep], order[:keep]
    soft = np.exp((vals - vals[0]) / p.temperature)
    return {int(t): float(q) for t, q in zip(order, soft / soft.sum(), strict=True)}


def chi_square_fails(counts: dict[int, int], probs: dict[int, float]) -> bool:
    """True when counts are off probs at p = 0.001 (Wilson-Hilferty's chi-square quantile);
    a token outside probs fails outright."""
    if set(counts) - set(probs):
        return True
    total = sum(counts.values())
    stat = sum((counts.get(t, 0) - total * q) ** 2 / (total * q) for t, q in probs.items())
    df = len(probs) - 1
    if df == 0:
        return False
    critical = df * (1 - 2 / (9 * df) + 3.09 * math.sqrt(2 / (9 * df))) ** 3
    return stat > critical


def draws(
    sampler: HostSampler,
    row: npt.NDArray[np.float32],
    p: SamplingParams,
    n: int,
    bans: frozenset[int] = frozenset(),
) -> dict[int, int]:
    counts: dict[int, int] = {}
    per_call = 500
    for start in range(0, n, per_call):
        seqs = [sampler.sequence(p, bans, seed) for seed in range(start, start + per_call)]
        assert all(s is not None for s in seqs)
        matrix = np.broadcast_to(row, (per_call, len(row)))
        for t in sampler.sample_rows(matrix, [s for s in seqs if s is not None]):
            counts[t] = counts.get(t, 0) + 1
    return counts


def peaked_row(rng: np.random.Generator, n_vocab: int, scale: float) -> npt.NDArray[np.float32]:
    return (rng.standard_normal(n_vocab) * scale).astype(np.float32)


def seq(
    sampler: HostSampler, p: SamplingParams, seed: int = 0, bans: frozenset[int] = frozenset()
) -> HostSequence:
    s = sampler.sequence(p, bans, seed)
    assert s is not None
    return s


@pytest.mark.parametrize("n_vocab", [49152, 8000, 1000, 70])
@pytest.mark.parametrize("top_k", [1, 5, 40, 256])
def test_candidates_are_each_rows_exact_top_k(n_vocab: int, top_k: int) -> None:
    """Flat, peaked and tied rows (rounded to a coarse grid), a vocabulary that is not a multiple of
    the group size, and a k past the vocabulary's group count falls back (None)."""
    rng = np.random.default_rng(top_k)
    sampler = HostSampler(n_vocab)
    p = replace(DEFAULTS, top_k=top_k)
    if top_k > sampler.n_blocks:
        assert sampler.sequence(p, frozenset(), 0) is None
        return
    rows = np.stack(
        [peaked_row(rng, n_vocab, s) for s in (0.5, 3.0, 8.0)] + [np.round(peaked_row(rng, n_vocab, 2.0))]
    )
    values, ids = sampler.top_k(rows, [seq(sampler, p) for _ in rows])
    for row, v, i in zip(rows, values, ids, strict=True):
        assert_exact_top_k(row, v, i, top_k)


def assert_exact_top_k(
    row: npt.NDArray[np.float32], values: npt.NDArray[np.float32], ids: npt.NDArray[np.int64], k: int
) -> None:
    """values are row's k largest, sorted, and ids k distinct tokens holding them."""
    assert np.array_equal(values, np.sort(row)[::-1][:k])
    assert np.array_equal(row[ids], values)
    assert len(set(ids.tolist())) == k


def test_banned_tokens_are_never_candidates_even_at_the_top() -> None:
    rng = np.random.default_rng(1)
    sampler = HostSampler(4096)
    row = peaked_row(rng, 4096, 2.0)
    top = np.argsort(-row)[:3]
    bans = frozenset(int(t) for t in top)
    values, ids = sampler.top_k(row[None, :], [seq(sampler, replace(DEFAULTS, ignore_eos=True), bans=bans)])
    banned_row = row.copy()
    banned_row[top] = -np.inf
    assert not bans & set(ids[0].tolist())
    assert np.array_equal(values[0], np.sort(banned_row)[::-1][:40])


def test_each_rows_bans_drop_its_own_candidates_only() -> None:
    """One call, three rows alike: the first bans its top three, the second none, the third its
    4th-6th; a token one row bans stays a candidate of the others."""
    rng = np.random.default_rng(2)
    sampler = HostSampler(49152)
    row = peaked_row(rng, 49152, 2.0)
    order = np.argsort(-row)
    ban_sets = [frozenset(int(t) for t in order[:3]), frozenset(), frozenset(int(t) for t in order[3:6])]
    p = replace(DEFAULTS, ignore_eos=True)
    seqs = [seq(sampler, p, seed=i, bans=bans) for i, bans in enumerate(ban_sets)]
    values, ids = sampler.top_k(np.stack([row] * 3), seqs)
    for v, i, bans in zip(values, ids, ban_sets, strict=True):
        expected = row.copy()
        expected[list(bans)] = -np.inf
        assert not bans & set(i.tolist())
        assert np.array_equal(v, np.sort(expected)[::-1][:40])


@pytest.mark.parametrize(
    "params",
    [
        DEFAULTS,
        replace(DEFAULTS, top_k=8, top_p=1.0, min_p=0.0, temperature=1.3),
        replace(DEFAULTS, top_k=100, top_p=0.5, min_p=0.0),
        replace(DEFAULTS, top_p=1.0, min_p=0.2, temperature=0.5),
    ],
)
def test_draws_follow_the_chains_distribution(params: SamplingParams) -> None:
    rng = np.random.default_rng(7)
    row = peaked_row(rng, 300, 1.5)
    sampler = HostSampler(300)
    counts = draws(sampler, row, params, 20_000)
    assert not chi_square_fails(counts, chain_probs(row, params))


def test_the_chi_square_can_fail() -> None:
    """The same draws against a neighbouring chain (another temperature) are told apart."""
    rng = np.random.default_rng(7)
    row = peaked_row(rng, 300, 1.5)
    counts = draws(HostSampler(300), row, DEFAULTS, 20_000)
    assert chi_square_fails(counts, chain_probs(row, replace(DEFAULTS, temperature=1.0)))


def test_bans_follow_the_distribution_without_the_banned() -> None:
    rng = np.random.default_rng(3)
    row = peaked_row(rng, 300, 1.5)
    bans = frozenset(int(t) for t in np.argsort(-row)[:2])
    counts = draws(HostSampler(300), row, replace(DEFAULTS, ignore_eos=True), 10_000, bans)
    assert not chi_square_fails(counts, chain_probs(row, DEFAULTS, bans))


def test_a_seed_repeats_itself_whatever_else_is_in_the_batch() -> None:
    rng = np.random.default_rng(5)
    rows = np.stack([peaked_row(rng, 2000, 1.0) for _ in range(30)])  # flat: many tokens to pick
    sampler = HostSampler(2000)

    def run(batch: list[int]) -> list[int]:
        mine = seq(sampler, DEFAULTS, seed=42)
        others = [seq(sampler, replace(DEFAULTS, top_k=7), seed=s) for s in batch]
        out = []
        for row in rows:
            out.append(sampler.sample_rows(np.stack([row] * (1 + len(batch))), [mine, *others])[0])
        return out

    alone = run([])
    assert run([1, 2, 3]) == alone
    assert len(set(alone)) > 1  # it did draw


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0),
        replace(DEFAULTS, top_k=0),
        replace(DEFAULTS, grammar="root ::= [a-z]+"),
        replace(DEFAULTS, repeat_penalty=1.1),
        replace(DEFAULTS, presence_penalty=0.5),
        replace(DEFAULTS, typical_p=0.9),
        replace(DEFAULTS, logit_bias=((5, float("inf")),)),
        replace(DEFAULTS, logit_bias=((5, float("nan")),)),
    ],
)
def test_chains_it_cannot_do_exactly_stay_native(params: SamplingParams) -> None:
    assert HostSampler(49152).sequence(params, frozenset(), 0) is None


def biased_row(row: npt.NDArray[np.float32], bias: dict[int, float]) -> npt.NDArray[np.float32]:
    """The row llama.cpp's logit-bias sampler hands on: each bias added in float32."""
    out = row.copy()
    for token, b in bias.items():
        out[token] = np.float32(out[token] + np.float32(b))
    return out


def mixed_bias(row: npt.NDArray[np.float32]) -> dict[int, float]:
    """A large push down on the top two (-100, finite here: the API makes a ban of OpenAI's), a
    small one on the 3rd, one up from the bottom into the top-k, and one up from the middle."""
    order = np.argsort(-row)
    return {
        int(order[0]): -100.0,
        int(order[1]): -100.0,
        int(order[2]): -0.3,
        int(order[-1]): float(row[order[0]] - row[order[-1]]) + 1.0,
        int(order[len(row) // 2]): float(row[order[5]] - row[order[len(row) // 2]]),
    }


@pytest.mark.parametrize("n_vocab", [49152, 1000])
@pytest.mark.parametrize("top_k", [1, 5, 40])
def test_finite_biases_give_the_biased_rows_exact_top_k(n_vocab: int, top_k: int) -> None:
    rng = np.random.default_rng(11 + top_k)
    sampler = HostSampler(n_vocab)
    rows = np.stack([peaked_row(rng, n_vocab, s) for s in (0.5, 3.0)])
    biases = [mixed_bias(r) for r in rows]
    seqs = [seq(sampler, replace(DEFAULTS, top_k=top_k, logit_bias=tuple(b.items()))) for b in biases]
    values, ids = sampler.top_k(rows, seqs)
    for row, bias, v, i in zip(rows, biases, values, ids, strict=True):
        assert_exact_top_k(biased_row(row, bias), v, i, top_k)


def test_biases_and_bans_apply_to_their_own_row_only() -> None:
    """Three rows alike: one biased, one plain, one banning; the plain row's top-k is the model's."""
    rng = np.random.default_rng(12)
    sampler = HostSampler(49152)
    row = peaked_row(rng, 49152, 2.0)
    bias = mixed_bias(row)
    order = np.argsort(-row)
    p = replace(DEFAULTS, logit_bias=tuple(bias.items()))
    ban = frozenset({int(order[0])})
    seqs = [
        seq(sampler, p),
        seq(sampler, DEFAULTS),
        seq(sampler, replace(DEFAULTS, ignore_eos=True), bans=ban),
    ]
    values, _ = sampler.top_k(np.stack([row] * 3), seqs)
    banned = row.copy()
    banned[order[0]] = -np.inf
    for v, expected in zip(values, (biased_row(row, bias), row, banned), strict=True):
        assert np.array_equal(v, np.sort(expected)[::-1][:40])


def test_biased_draws_follow_the_chain_on_the_biased_row() -> None:
    rng = np.random.default_rng(13)
    row = peaked_row(rng, 300, 1.5)
    bias = mixed_bias(row)
    params = replace(DEFAULTS, logit_bias=tuple(bias.items()))
    counts = draws(HostSampler(300), row, params, 20_000)
    assert not chi_square_fails(counts, chain_probs(biased_row(row, bias), DEFAULTS))
    assert chi_square_fails(counts, chain_probs(row, DEFAULTS))  # the unbiased chain's is told apart
