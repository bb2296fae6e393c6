"""Real llama.cpp: requests sharing a long system prompt arrive together at a fresh engine.

None finds the prompt in any slot, so without sharing each would evaluate all of it. The first
admitted computes it; the others wait for its KV, copy the shared prefix (tagged cells in one pool,
a copied stream with a stream per slot) and evaluate only their own tails. Their tokens must be
those of a run with the prefix cache off: identical, except that a stream may part from it at a
near-tie. A shared prefix sits elsewhere in the KV pool than an own copy would, so attention sums
the same products in another order; on the Intel Xeons that gave bit-identical logits, on an AMD
EPYC (Zen 3, AVX2) a random-weight model's top two logits were close enough for that rounding to
swap them.

The engine thread is held on a job while the requests are submitted, so all of them are queued
before its first step, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams, TokenEvent, TokenLogprob
from outpost.serving.assembly import Engine
from outpost.serving.engine_core import LocalStream

# Greedy, with the top-2 log-probabilities of every step: where two runs part, the gap says why.
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, n_probs=2)
# Two runs may part only where the top two log-probabilities are this close (nats). Rounding moves
# logits by ~1e-5 here; a real divergence (a wrong KV cell) moves them by far more than this.
NEAR_TIE = 0.01
SLOTS = 6
SYSTEM = "You are a meticulous archivist of lanterns, maps and tide tables in a harbour town. " * 8
QUESTIONS = [
    "Catalogue the copper lantern.",
    "Describe the orchard at dusk.",
    "Which map shows the northern reef?",
    "List three tide tables.",
    "Who kept the harbour light?",
    "Write a label for the brass compass.",
]


def _engine(model: Path, kv_unified: str, prefix_cache: bool) -> Engine:
    # f32 KV and no flash attention: a copied prefix gives the very same logits as evaluating it.
    config = EngineConfig(
        model_path=str(model),
        n_ctx=SLOTS * 512,
        n_seq_max=SLOTS,
        n_batch=64,  # the shared prompt takes several steps to prefill
        n_threads=1,
        kv_cache_type="f32",
        flash_attn="off",
        kv_unified=kv_unified,  # type: ignore[arg-type]
    )
    return Engine(config, prefix_cache=prefix_cache)


Run = tuple[list[int], TokenEvent, list[TokenLogprob]]


async def _drain(stream: LocalStream) -> Run:
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    last: TokenEvent | None = None
    async for event in stream:
        tokens += event.token_ids
        logprobs += event.logprobs or []
        last = event
    assert last is not None and last.finished
    return tokens, last, logprobs


def _gap(step: TokenLogprob) -> float:
    assert len(step.top) >= 2, "every step carries its top two"
    return step.top[0][1] - step.top[1][1]


def _same_or_near_tie(shared: Run, plain: Run) -> bool:
    """True where the two streams are identical; where they part, it must be at a near-tie in both."""
    n = _common_prefix(shared[0], plain[0])
    if n == len(plain[0]) == len(shared[0]):
        return True
    gaps = (_gap(shared[2][n]), _gap(plain[2][n]))
    assert max(gaps) < NEAR_TIE, f"parted at token {n} with top-2 gaps {gaps}: not a near-tie"
    return False


def _together(eng: Engine, prompts: list[list[int]], max_tokens: int) -> list[Run]:
    """Submits every request while the engine thread waits on a job, then lets it go."""

    async def main() -> list[Run]:
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            held.set()
            release.wait(60)

        done = eng.core.run_on_engine_thread(hold)
        assert held.wait(60), "the engine thread never ran the job"
        streams = [eng.client.open(GenerateRequest(p, max_tokens, GREEDY)) for p in prompts]
        release.set()
        done.result(60)
        return await asyncio.wait_for(asyncio.gather(*(_drain(s) for s in streams)), 300)

    return asyncio.run(main())


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("kv_unified", ["auto", "on"])
def test_a_system_prompt_shared_by_requests_arriving_together_is_evaluated_once(
    tiny_model: Path, kv_unified: str
) -> None:
    results = {}
    for prefix_cache in (True, False):
        with _engine(tiny_model, kv_unified, prefix_cache) as eng:
            assert eng.model.kv_unified == (kv_unified == "on")
            prompts = [
                eng.tokenize_prompt(
                    eng.render_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
                )
                for q in QUESTIONS
            ]
            results[prefix_cache] = _together(eng, prompts, 24)
    shared = [_common_prefix(prompts[0], p) for p in prompts[1:]]
    assert min(shared) >= 150, "the system prompt is long"
    tails = [len(p) - n for p, n in zip(prompts[1:], shared, strict=True)]

    timings = [last.timings for _, last, _ in results[True]]
    assert all(t is not None for t in timings)
    assert [(t.cache_n, t.prompt_n) for t in timings if t is not None] == [
        (0, len(prompts[0])),
        *zip(shared, tails, strict=True),
    ]
    assert sum(t.prompt_n for t in timings if t is not None) == len(prompts[0]) + sum(tails)
    plain = [last.timings for _, last, _ in results[False]]
    assert sum(t.prompt_n for t in plain if t is not None) == sum(len(p) for p in prompts)

    assert [len(tokens) for tokens, _, _ in results[True]] == [24] * SLOTS
    same = [_same_or_near_tie(a, b) for a, b in zip(results[True], results[False], strict=True)]
    assert sum(same) >= SLOTS // 2, f"most streams are identical to the unshared run: {same}"
