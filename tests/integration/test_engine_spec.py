"""Speculative decoding on real llama.cpp (the synthetic tiny model): drafts verified in the batch.

Verifying a draft decodes several positions of a sequence at once, which may move the logits by
rounding (llama-server's own speculative arms part from its plain arm too). So greedy output must
equal plain decoding's wherever the logits leave no near-tie: at any token where the two part,
the plain run's two best candidates must be within a hair of each other.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import outpost.serving.assembly
from outpost.engine.config import EngineConfig
from outpost.engine.draft_model import DraftModel
from outpost.engine.executor import ModelRunner
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.messages import GenerateRequest, SamplingParams, SpecParams, SpecRequest, TokenEvent
from outpost.scheduler.output import DraftAsk
from outpost.scheduler.speculation import SpecCosts
from outpost.serving.assembly import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True, n_probs=2)
NEAR_TIE = 0.05  # logits: a parting where the best two were further apart is a real difference


def _config(model: Path, n_batch: int = 128) -> EngineConfig:
    return EngineConfig(
        model_path=str(model),
        n_ctx=4 * 512,
        n_seq_max=4,
        n_batch=n_batch,
        n_threads=1,
        kv_cache_type="f32",
        flash_attn="off",
    )


@pytest.fixture
def cheap_draft(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model drafting for itself costs a whole target step (measured at start), so the
    engine rightly never asks it (`catch_up_pays`: not even a perfect draft could repay reading a
    prompt). These tests check the mechanism, not the economics: the draft is priced as a small
    one would be."""
    costs = SpecCosts(0.1, 0.1, 0.001, True, "priced for the test")
    monkeypatch.setattr(outpost.serving.assembly, "_spec_costs", lambda *_: costs)


def _engine(model: Path, **kw: object) -> Engine:
    return Engine(_config(model), prefix_cache=False, prefill_budget="off", **kw)  # type: ignore[arg-type]


async def _run(engine: Engine, req: GenerateRequest) -> tuple[list[int], TokenEvent, list[float]]:
    tokens: list[int] = []
    gaps: list[float] = []
    last: TokenEvent | None = None
    async for event in engine.client.open(req):
        tokens += event.token_ids
        for lp in event.logprobs or []:
            gaps.append(lp.top[0][1] - lp.top[1][1] if len(lp.top) > 1 else float("inf"))
        last = event
    assert last is not None and last.finished and last.error is None, last
    return tokens, last, gaps


def _prompts(eng: Engine) -> list[list[int]]:
    text = "The quick brown fox jumps over the lazy dog. " * 6
    return [eng.tokenize_prompt(f"{i}: {text} Repeat: {text[: 20 + 9 * i]}") for i in range(4)]


def _compare(eng: Engine, spec: SpecRequest) -> tuple[int, int, int]:
    """(identical outputs, draft tokens, accepted), checking every parting is a near-tie."""
    same = drafted = accepted = 0
    for prompt in _prompts(eng):
        plain, _, gaps = asyncio.run(
            _run(eng, GenerateRequest(prompt, 96, GREEDY, speculative=SpecRequest("none")))
        )
        fast, last, _ = asyncio.run(_run(eng, GenerateRequest(prompt, 96, GREEDY, speculative=spec)))
        assert last.timings is not None and len(fast) == 96
        drafted += last.timings.draft_n
        accepted += last.timings.draft_n_accepted
        if fast == plain:
            same += 1
            continue
        parting = next(i for i, (a, b) in enumerate(zip(plain, fast, strict=True)) if a != b)
        assert gaps[parting] < NEAR_TIE, (
            f"parted at {parting} where the top two were {gaps[parting]:.3f} apart"
        )
    return same, drafted, accepted


def test_ngram_speculation_keeps_greedy_output(tiny_model: Path) -> None:
    """ngram-simple with 2-token n-grams: the random model's short repeats get drafted (llama.cpp's
    12-token default finds none in its output; ngram-mod's 24 neither: the unit tests cover it)."""
    with _engine(tiny_model, ngram_simple=(2, 8)) as eng:
        same, drafted, accepted = _compare(eng, SpecRequest("ngram-simple", n_max=16, n_min=0))
    assert drafted > 0 and accepted > 0, "nothing was speculated: the test proves nothing"
    assert same >= 3, f"only {same} of 4 greedy outputs identical"


@pytest.mark.usefixtures("cheap_draft")
def test_draft_model_speculation(tiny_model: Path) -> None:
    """The target as its own draft model: the same network, so nearly every draft token is kept."""
    with _engine(
        tiny_model, speculative=SpecParams("draft", n_max=8), draft_model_path=str(tiny_model)
    ) as eng:
        same, drafted, accepted = _compare(eng, SpecRequest("draft"))
    assert drafted > 0 and accepted / drafted > 0.8, (drafted, accepted)
    assert same >= 3


@pytest.mark.usefixtures("cheap_draft")
def test_a_grammar_sees_accepted_tokens_in_order(tiny_model: Path) -> None:
    """A grammar-constrained request verifies drafts (the draft model knows no grammar) and says
    what it says without speculation."""
    grammar = 'root ::= "[" item ("," item)* "]"\nitem ::= [0-9]+'
    sampling = SamplingParams(temperature=0.0, grammar=grammar)
    with _engine(
        tiny_model, speculative=SpecParams("draft", n_max=8), draft_model_path=str(tiny_model)
    ) as eng:
        prompt = eng.tokenize_prompt("Numbers: [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20] again:")
        plain, _, _ = asyncio.run(
            _run(eng, GenerateRequest(prompt, 80, sampling, speculative=SpecRequest("none")))
        )
        fast, last, _ = asyncio.run(_run(eng, GenerateRequest(prompt, 80, sampling)))
        text = eng.vocab.detokenize(fast)
    assert last.timings is not None and last.timings.draft_n > 0
    assert fast == plain
    assert text.startswith("[") and set(text) <= set("[],0123456789"), text


def test_sampled_requests_speculate_with_a_seed(tiny_model: Path) -> None:
    """A seeded sampled request draws once per emitted token: the same text with or without drafts
    (where the logits agree)."""
    sampling = SamplingParams(temperature=0.7, seed=42, ignore_eos=True)
    with _engine(tiny_model, ngram_simple=(2, 8)) as eng:
        prompt = _prompts(eng)[0]
        plain, _, _ = asyncio.run(
            _run(eng, GenerateRequest(prompt, 64, sampling, speculative=SpecRequest("none")))
        )
        fast, last, _ = asyncio.run(
            _run(eng, GenerateRequest(prompt, 64, sampling, speculative=SpecRequest("ngram-simple", n_max=8)))
        )
    assert last.timings is not None and last.timings.draft_n_accepted > 0
    assert fast == plain


def test_a_draft_catch_up_longer_than_a_batch_drafts_from_the_right_logits(tiny_model: Path) -> None:
    """Three sequences whose histories together take several decodes of n_batch: each gets its
    draft, from its own logits. (The rows of a sequence finished in an earlier decode were once
    read after a later decode had replaced the logits: an engine error, or a wrong draft.) Asked
    again with everything held, each catch-up is one token in one decode: the drafts must agree."""
    model = LoadedModel(_config(tiny_model, n_batch=64))
    draft = DraftModel(model, model.vocab.n_tokens)
    try:
        histories = [[10 + (7 * i + s) % 200 for i in range(n)] for s, n in enumerate((100, 70, 45))]
        asks = [DraftAsk(seq, f"r{seq}", h, 4) for seq, h in enumerate(histories)]
        first = draft.draft(asks, {})
        assert sorted(first) == [0, 1, 2] and all(len(d) == 4 for d in first.values()), first
        assert draft.draft(asks, {}) == first
    finally:
        draft.close()


def test_a_draft_of_n_tokens_takes_n_draft_model_decodes(tiny_model: Path) -> None:
    """After a verified draft a history is two tokens ahead of the draft KV (the last draft token
    and the one sampled after it): the catch-up and the first draft token share one decode, so a
    draft of n tokens costs n draft-model decodes (it once cost n + 1), and it is the draft a
    draft model reading the whole history fresh makes."""
    histories = [[10 + (7 * i + s) % 200 for i in range(n)] for s, n in enumerate((40, 25))]
    ahead = [[*h, 5, 6] for h in histories]
    model = LoadedModel(_config(tiny_model))
    draft = DraftModel(model, model.vocab.n_tokens)
    other = LoadedModel(_config(tiny_model))
    fresh = DraftModel(other, other.vocab.n_tokens)
    decodes: list[int] = []
    decode = draft._decode
    draft._decode = lambda chunks: decodes.append(len(chunks)) or decode(chunks)  # type: ignore[method-assign]
    try:
        draft.draft([DraftAsk(seq, f"r{seq}", h, 4) for seq, h in enumerate(histories)], {})
        decodes.clear()
        second = draft.draft([DraftAsk(seq, f"r{seq}", h, 4) for seq, h in enumerate(ahead)], {})
        assert len(decodes) == 4, decodes
        expected = fresh.draft([DraftAsk(seq, f"r{seq}", h, 4) for seq, h in enumerate(ahead)], {})
        assert second == expected
    finally:
        draft.close()
        fresh.close()


def test_prices_are_timed_as_a_verification_after_a_history(tiny_model: Path) -> None:
    """Speculation's prices are timed on real llama.cpp as a verification runs: a step and a step
    of 1 + VERIFY_DRAFT tokens with logits at each, after a history; the KV is left empty, so the
    first request finds the cache as a fresh engine's."""
    model = LoadedModel(_config(tiny_model))
    runner = ModelRunner(model)
    try:
        step, verify = runner.measure_verify_times()
        assert 0 < step < verify < float("inf")
        assert llama.llama_memory_seq_pos_max(model.memory, 0) == -1
        draft = DraftModel(LoadedModel(_config(tiny_model)), model.vocab.n_tokens)
        try:
            assert 0 < draft.measure_step_at_depth() < float("inf") and not draft.cached
        finally:
            draft.close()
    finally:
        model.close()
