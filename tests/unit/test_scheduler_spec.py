"""Speculative decoding in the scheduler, against the fake runner: lossless, adaptive, within budgets.

Every run is compared with the same requests decoded without speculation: same token ids, same
text, token for token (the fake's logits depend only on the history, as identical logits would).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from fake_runner import FakeRunner, default_next
from sched_harness import Harness, greedy

from outpost.messages import RequestRejected, SamplingParams, SpecParams, SpecRequest
from outpost.scheduler import SchedulerConfig
from outpost.scheduler.drafters import NgramMod, NgramSimple
from outpost.scheduler.speculation import SpecState, catch_up_pays, may_probe, plan_drafts

NGRAM_SIMPLE = SpecRequest("ngram-simple", n_max=16)
NGRAM_MOD = SpecRequest("ngram-mod", n_max=16)
DRAFT = SpecRequest("draft", n_max=8)
ALL = [NGRAM_SIMPLE, NGRAM_MOD, DRAFT]


def document(n: int, seed: int = 1) -> list[int]:
    """Letters in a pattern without short repeats: an n-gram of 12 occurs once."""
    out, x = [], seed
    for _ in range(n):
        x = (x * 1103515245 + 12345) % (1 << 31)
        out.append(1 + (x >> 16) % 26)
    return out


def copying_runner(prompt: Sequence[int], copy_from: int, n_copy: int, **kwargs: object) -> FakeRunner:
    """A runner whose answer to `prompt` copies n_copy tokens of it from copy_from, then wanders."""
    runner = FakeRunner(**kwargs)  # type: ignore[arg-type]
    runner.script(prompt, list(prompt[copy_from : copy_from + n_copy]))
    return runner


def half_right_draft(runner: FakeRunner):
    """A draft model that agrees with the target but errs on every fourth token of its draft."""

    def draft(history: list[int], n: int) -> list[int]:
        h, out = list(history), []
        for i in range(n):
            t = runner.next_token(h)
            if i % 4 == 3:
                t = 1 + t % 26
            out.append(t)
            h.append(t)
        return out

    return draft


def run_all(
    config: SchedulerConfig,
    prompts: list[list[int]],
    runner: FakeRunner,
    spec: SpecRequest | None,
    **kw: object,
) -> tuple[Harness, list[str]]:
    h = Harness(config, runner)
    rids = [h.add(p, speculative=spec, **kw) for p in prompts]
    h.run()
    return h, rids


def config(**kw: object) -> SchedulerConfig:
    base = {"n_slots": 4, "n_ctx": 4096, "n_ctx_seq": 1024, "step_token_budget": 256, "draft_model": True}
    base["draft_token_cost"] = 0.05  # the fake draft model costs nothing
    base["draft_read_cost"] = 0.0
    base.update(kw)
    return SchedulerConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.type)
def test_greedy_output_is_token_for_token_the_same(spec: SpecRequest) -> None:
    doc = document(300)
    prompt = [*doc, 27, *doc[:40]]  # the answer goes on copying the document
    plain, [r0] = run_all(
        config(), [prompt], copying_runner(prompt, 40, 120), None, max_tokens=150, sampling=greedy()
    )
    runner = copying_runner(prompt, 40, 120)
    runner.draft_model = half_right_draft(runner)
    fast, [r1] = run_all(config(), [prompt], runner, spec, max_tokens=150, sampling=greedy())
    assert fast.token_ids(r1) == plain.token_ids(r0)
    assert fast.text(r1) == plain.text(r0)
    t = fast.final(r1).timings
    assert t is not None and t.draft_n > 0 and t.draft_n_accepted > 0
    assert t.predicted_n == 150
    assert runner.verified == t.draft_n and runner.verifications == t.draft_steps > 0
    assert fast.n_steps < plain.n_steps * 0.6, (fast.n_steps, plain.n_steps)


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.type)
def test_same_output_under_preemption_and_prefix_sharing(spec: SpecRequest) -> None:
    """KV too small for all four: requests are preempted and recomputed; two share a prefix."""
    doc = document(200, seed=3)
    prompts = [[*doc, 27, *doc[i * 10 : i * 10 + 30]] for i in range(3)] + [doc[:150]]

    def runner() -> FakeRunner:
        r = FakeRunner(capacity=700)
        for p, i in zip(prompts, range(4), strict=True):
            r.script(p, doc[i * 10 + 30 : i * 10 + 110])
        r.draft_model = half_right_draft(r)
        return r

    cfg = config(n_ctx=700, n_ctx_seq=400)
    plain, rids0 = run_all(cfg, prompts, runner(), None, max_tokens=90, sampling=greedy())
    fast_runner = runner()
    fast, rids1 = run_all(cfg, prompts, fast_runner, spec, max_tokens=90, sampling=greedy())
    for a, b in zip(rids0, rids1, strict=True):
        assert fast.token_ids(b) == plain.token_ids(a)
        assert fast.text(b) == plain.text(a)
    assert any(s.memory_ops for s in fast_runner.steps)
    assert fast_runner.verified > 0
    assert sum(fast.final(r).timings.draft_n_accepted for r in rids1) > 0  # type: ignore[union-attr]


def test_preemption_happens_mid_speculation() -> None:
    """A tight cache: a speculating request is preempted, recomputed, and still says the same."""
    doc = document(120, seed=5)
    prompts = [[*doc, 27, *doc[:30]], [*doc[5:], 27, *doc[5:35]]]

    def runner() -> FakeRunner:
        r = FakeRunner(capacity=330)
        for p in prompts:
            r.script(p, doc[30:100])
        return r

    cfg = config(n_slots=2, n_ctx=330, n_ctx_seq=300)
    plain, rids0 = run_all(cfg, prompts, runner(), None, max_tokens=100, sampling=greedy())
    fr = runner()
    fast, rids1 = run_all(cfg, prompts, fr, NGRAM_SIMPLE, max_tokens=100, sampling=greedy())
    for a, b in zip(rids0, rids1, strict=True):
        assert fast.token_ids(b) == plain.token_ids(a)
    # A recompute after a preemption is a prompt chunk that starts at 0 beside a generating stream.
    recomputed = [c for s in fr.steps[1:] for c in s.chunks if c.start_pos == 0 and len(c.tokens) > 100]
    assert recomputed, "no preemption happened: the test proves nothing"
    assert fr.verified > 0


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.type)
def test_a_stateful_chain_sees_the_accepted_tokens_in_order(spec: SpecRequest) -> None:
    """A grammar's (or seeded RNG's) state moves with every token it emits: the chain must see the
    output exactly, in order, and nothing it rejected."""
    doc = document(200, seed=7)
    prompt = [*doc, 27, *doc[:30]]

    def oracle_runner() -> FakeRunner:
        r = FakeRunner(stateful_chains=True)

        def draft(history: list[int], n: int) -> list[int]:
            h, out = list(history), []
            for i in range(n):
                k = len(h) - len(prompt)
                t = r.next_token(h)
                t = 1 + (t + 7 * k) % 26
                out.append(t if i % 3 != 2 else 1 + t % 26)
                h.append(out[-1])
            return out

        r.draft_model = draft
        return r

    plain, [a] = run_all(config(), [prompt], oracle_runner(), None, max_tokens=60, sampling=greedy())
    fr = oracle_runner()
    fast, [b] = run_all(config(), [prompt], fr, spec, max_tokens=60, sampling=greedy())
    assert fast.token_ids(b) == plain.token_ids(a)
    if spec.type == "draft":
        assert fast.final(b).timings.draft_n_accepted > 0  # type: ignore[union-attr]


def test_rejected_positions_leave_the_kv_cache() -> None:
    doc = document(200, seed=9)
    prompt = [*doc, 27, *doc[:20]]
    runner = FakeRunner()
    runner.script(prompt, [*doc[20:40], 5, 5, 5, 5, *doc[44:80]])  # the copy breaks at 4 tokens
    h = Harness(config(), runner)
    rid = h.add(prompt, 60, speculative=NGRAM_SIMPLE, sampling=greedy())
    h.run()
    removes = [op for s in runner.steps for op in s.memory_ops if getattr(op, "p0", -1) > 0]
    assert removes, "a rejected draft left no seq_rm"
    assert h.final(rid).timings.draft_n > h.final(rid).timings.draft_n_accepted  # type: ignore[union-attr]


def test_draft_tokens_stay_within_the_step_budget_and_after_decodes() -> None:
    doc = document(200, seed=11)
    prompts = [[*doc, 27, *doc[i : i + 20]] for i in range(4)]
    runner = FakeRunner()
    for i, p in enumerate(prompts):
        runner.script(p, doc[i + 20 : i + 120])
    cfg = config(step_token_budget=24, prefill_budget=8)
    h = Harness(cfg, runner)
    for p in prompts:
        h.add(p, 100, speculative=NGRAM_SIMPLE, sampling=greedy())
    h.run()  # the harness asserts num_tokens <= budget and decodes before prompt chunks
    assert runner.verified > 0
    assert max(s.num_tokens for s in runner.steps) <= 24


def test_sampled_output_with_a_seed_is_the_same_and_keeps_the_distribution() -> None:
    """Seeded sampling: the chain draws once per emitted token, so speculation changes nothing;
    and the emitted tokens follow the target's distribution (chi-square, fixed seeds)."""
    probs = {1: [0.0, 0.1, 0.2, 0.3, 0.4], 2: [0.0, 0.4, 0.3, 0.2, 0.1], 3: [0.0, 0.25, 0.25, 0.25, 0.25]}

    def dist(history: Sequence[int]) -> list[float]:
        return probs.get(history[-1], probs[3])

    def runner() -> FakeRunner:
        r = FakeRunner()
        r.dist = dist
        r.draft_model = lambda history, n: [4] * n  # always the same guess: often wrong
        return r

    prompts = [[3, 1, 2, 3] for _ in range(40)]
    sampling = [SamplingParams(temperature=1.0, seed=100 + i) for i in range(40)]

    def run(spec: SpecRequest | None) -> tuple[Harness, list[str], FakeRunner]:
        r = runner()
        h = Harness(config(n_slots=4), r)
        rids = [h.add(p, 60, speculative=spec, sampling=s) for p, s in zip(prompts, sampling, strict=True)]
        h.run()
        return h, rids, r

    plain, rids0, _ = run(None)
    fast, rids1, fr = run(SpecRequest("draft", n_max=4))
    assert fr.verified > 0
    pairs: dict[tuple[int, int], int] = {}
    for a, b in zip(rids0, rids1, strict=True):
        assert fast.token_ids(b) == plain.token_ids(a)
        seq = [3, *fast.token_ids(b)]  # the prompt ends in 3: the first token is drawn after it
        for x, y in itertools.pairwise(seq):
            pairs[(x, y)] = pairs.get((x, y), 0) + 1
    assert chi_square(pairs, probs) < 30.6  # 15 degrees of freedom, p = 0.01


def chi_square(pairs: dict[tuple[int, int], int], probs: dict[int, list[float]]) -> float:
    stat = 0.0
    for prev in (1, 2, 3, 4):
        row = probs.get(prev, probs[3])
        total = sum(pairs.get((prev, t), 0) for t in (1, 2, 3, 4))
        for t in (1, 2, 3, 4):
            expected = total * row[t]
            stat += (pairs.get((prev, t), 0) - expected) ** 2 / expected
    return stat


def test_a_biased_verifier_fails_the_chi_square() -> None:
    """The statistic above can fail: always keeping the draft token (4) is far off the target."""
    probs = {1: [0.0, 0.1, 0.2, 0.3, 0.4], 2: [0.0, 0.4, 0.3, 0.2, 0.1], 3: [0.0, 0.25, 0.25, 0.25, 0.25]}
    pairs = {(p, t): 10 for p in (1, 2, 3) for t in (1, 2, 3)}
    pairs.update({(p, 4): 200 for p in (1, 2, 3, 4)})
    assert chi_square(pairs, probs) > 30.6


def test_draft_length_follows_acceptance() -> None:
    good, bad = SpecState(SpecParams("ngram-simple", 16)), SpecState(SpecParams("ngram-simple", 16))
    for _ in range(10):
        good.record(8, 8)
        bad.record(8, 0)
    assert good.useful_length(0.15) == 16
    assert bad.useful_length(0.15) == 0
    [k_good, k_bad] = plan_drafts([(good, 16), (bad, 16)], 2, 0.15, 100)
    assert k_good > 8 and k_bad == 0


def test_an_always_accepted_draft_is_verified_whole_where_it_pays() -> None:
    """The margin is asked of the step, not of each token: a request whose drafts are always
    accepted verifies all 16 tokens alone at half a step a token (17 tokens for 9 steps), where
    asking each token to beat the step's rate by 10% stopped at 9."""
    sure = SpecState(SpecParams("ngram-simple", 16))
    for _ in range(20):
        sure.record(16, 16)
    assert plan_drafts([(sure, 16)], 1, 0.5, 100) == [16]
    # Beside 7 other streams at 0.6 a token the plain step yields 8 tokens for 5.2 steps (1.54):
    # even certain tokens (at best 1 / 0.6 = 1.67 a step) do not beat it by the margin.
    assert plan_drafts([(sure, 16)] * 8, 8, 0.6, 1000) == [0] * 8
    assert plan_drafts([(sure, 16)] * 2, 2, 0.6, 1000) == [16, 16]
    # A coin-flip token alone at half a step: 1.5 tokens for 1.5 steps is no gain, so no draft.
    coin = SpecState(SpecParams("ngram-simple", 16))
    assert plan_drafts([(coin, 16)], 1, 0.5, 100) == [0]


def test_speculation_turns_off_when_the_step_is_compute_bound() -> None:
    states = [SpecState(SpecParams("ngram-simple", 16)) for _ in range(8)]
    for s in states:
        for _ in range(5):
            s.record(8, 6)  # p ~ 0.86
    per_stream = []
    for n in (1, 2, 4, 8):
        ks = plan_drafts([(s, 16) for s in states[:n]], n, 0.25, 1000)
        per_stream.append(sum(ks) / n)
    assert per_stream == sorted(per_stream, reverse=True) and per_stream[0] > per_stream[-1]
    # Where one more token costs as much as a whole step, nothing is worth drafting.
    assert plan_drafts([(s, 16) for s in states], 8, 1.0, 1000) == [0] * 8


def test_probes_stop_where_even_a_certain_draft_cannot_pay() -> None:
    # n-gram drafts cost the step a token's place only: probes go on at 8 and 16 streams.
    assert may_probe(8, 0.25) and may_probe(16, 0.25)
    # Where one more token costs as much as a step, not beside another stream.
    assert not may_probe(2, 1.0)
    # Reading 1,000 unread tokens at 0.05 a token (50 steps) against at most 1 - (0.15 + 0.5) of a
    # step saved per token left: not with 100 left (35), yes with 200 (70).
    assert not catch_up_pays(1000, 100, 0.15, 0.5, 0.05) and catch_up_pays(1000, 200, 0.15, 0.5, 0.05)
    assert catch_up_pays(0, 1, 0.15, 0.5, 0.05)  # nothing to read: a probe costs only its draft
    # A draft model costing 0.6 of a target step pays alone, not beside another stream.
    assert may_probe(2, 0.25, 0.1) and not may_probe(2, 0.25, 0.6)
    # Alone a request always may: it delays nobody (a draft model as dear as the target too).
    assert may_probe(1, 0.25, 0.6) and may_probe(1, 1.0, 1.0)


def test_a_bad_drafter_costs_few_verified_tokens() -> None:
    """Drafts that are always wrong: after a few tries the request only probes now and then."""
    doc = document(100, seed=13)
    prompt = [*doc, 27]
    runner = FakeRunner()
    runner.draft_model = lambda history, n: [1 + (default_next(history) % 26)] * n  # never right
    h = Harness(config(), runner)
    rid = h.add(prompt, 200, speculative=DRAFT, sampling=greedy())
    h.run()
    t = h.final(rid).timings
    assert t is not None and t.draft_n_accepted == 0
    assert 0 < t.draft_n < 40, t.draft_n


def test_the_draft_model_reads_the_prompt_in_the_step_of_the_first_token() -> None:
    """A draft model dear enough that the prior estimate never drafts (p = 0.5 under the bar): the
    step that samples the first token still asks it (it reads the prompt there, inside the
    prompt's time, as llama-server's does), and its guess is verified in the very next step; a
    right guess raises the estimate, a wrong one idles the request as before."""
    doc = document(300, seed=21)
    prompt = [*doc, 27]
    runner = FakeRunner()
    asked: list[tuple[int, int, int]] = []  # (step, history length, n) of each ask

    def draft(history: list[int], n: int) -> list[int]:
        asked.append((len(runner.steps) - 1, len(history), n))
        return [runner.next_token(history)][:n]  # always right

    runner.draft_model = draft
    h = Harness(config(draft_token_cost=0.7), runner)
    rid = h.add(prompt, 40, speculative=DRAFT, sampling=greedy())
    h.run()
    first = next(i for i, out in enumerate(runner.steps) if any(c.sample for c in out.chunks))
    assert asked[0] == (first, len(prompt) + 1, 1)  # the prompt and the first token, in its step
    assert [c.n_draft for c in runner.steps[first + 1].chunks] == [1]
    assert h.token_ids(rid) == greedy_reference(prompt, 40)
    t = h.final(rid).timings
    assert t is not None and t.draft_n_accepted >= 1


def always_right_draft_model() -> tuple[FakeRunner, list[int]]:
    """A runner whose draft model is always right, and the history length of each ask it gets."""
    runner = FakeRunner()
    asked: list[int] = []

    def draft(history: list[int], n: int) -> list[int]:
        asked.append(len(history))
        return greedy_continuation(runner, history, n)

    runner.draft_model = draft
    return runner, asked


@pytest.mark.parametrize("read_cost, asks", [(0.0, True), (0.2, False)])
def test_a_long_prompt_is_read_into_the_draft_model_only_where_that_can_pay(
    read_cost: float, asks: bool
) -> None:
    """One stream, a 301-token prompt and 40 tokens to sample. Even a draft certain to be right
    saves at most 1 - (0.15 + 0.7) of a step a token (6 steps in all): reading the prompt at 0.2
    of a step a token (60 steps) cannot pay, so the draft model is never asked, not even at the
    first token (where it once always was); a free read is made there."""
    prompt = [*document(300, seed=21), 27]
    runner, asked = always_right_draft_model()
    h = Harness(config(draft_token_cost=0.7, draft_read_cost=read_cost), runner)
    rid = h.add(prompt, 40, speculative=DRAFT, sampling=greedy())
    h.run()
    assert bool(asked) == asks, asked
    if asks:
        assert asked[0] == len(prompt) + 1  # at the first token
    assert h.token_ids(rid) == greedy_reference(prompt, 40)


def test_a_dear_draft_model_is_not_asked_while_many_streams_decode() -> None:
    """Four streams and a draft model whose step costs 0.7 of the target's: even a draft certain
    to be right would not pay for its place in a 4-stream step, so no request probes (a probe
    would make the draft model read the request's whole prompt, stalling all four). Once the
    long request decodes alone it probes, and from then on drafts."""
    prompts = [[*document(120, seed=40 + i), 27] for i in range(4)]
    runner = FakeRunner()
    asked: list[int] = []  # the step of each ask

    def draft(history: list[int], n: int) -> list[int]:
        asked.append(len(runner.steps) - 1)
        return greedy_continuation(runner, history, n)  # always right

    runner.draft_model = draft
    h = Harness(config(draft_token_cost=0.7), runner)
    lengths = [12, 12, 12, 80]
    rids = [h.add(p, n, speculative=DRAFT, sampling=greedy()) for p, n in zip(prompts, lengths, strict=True)]
    h.run()
    sampling = [sum(1 for c in out.chunks if c.sample) for out in runner.steps]
    alone = next(i for i, n in enumerate(sampling) if i > 0 and n == 1)
    assert asked and min(asked) >= alone, (asked, sampling)
    for rid, prompt, n in zip(rids, prompts, lengths, strict=True):
        assert h.token_ids(rid) == greedy_reference(prompt, n)
    t = h.final(rids[3]).timings
    assert t is not None and t.draft_n_accepted > 0
    assert all(h.final(r).timings.draft_n == 0 for r in rids[:3])  # type: ignore[union-attr]


@pytest.mark.parametrize("read_cost, reads", [(0.0, True), (0.2, False)])
def test_a_late_probe_reads_an_unread_prompt_only_where_that_can_pay(read_cost: float, reads: bool) -> None:
    """Four streams, so nobody probes at the first token; the long request then decodes alone with
    68 tokens to go and its 133-token history unread. Even a perfect draft saves at most
    1 - (0.15 + 0.7) of a step per token (10 steps): a read at 0.2 of a step a token (27 steps)
    cannot pay and is never made; a free one is."""
    prompts = [[*document(120, seed=40 + i), 27] for i in range(4)]
    runner, asked = always_right_draft_model()
    h = Harness(config(draft_token_cost=0.7, draft_read_cost=read_cost), runner)
    lengths = [12, 12, 12, 80]
    rids = [h.add(p, n, speculative=DRAFT, sampling=greedy()) for p, n in zip(prompts, lengths, strict=True)]
    h.run()
    assert bool(asked) == reads, asked
    for rid, prompt, n in zip(rids, prompts, lengths, strict=True):
        assert h.token_ids(rid) == greedy_reference(prompt, n)


def test_a_draft_made_beside_a_verification_is_verified_next() -> None:
    """The runner drafts after every step's tokens, a verified draft's included: with a draft
    model that is always right, every step after the first token verifies a draft (a draft made
    in a step that verified one was once dropped, so only every other step speculated)."""
    prompt = [*document(200, seed=23), 27]
    runner = FakeRunner()
    runner.draft_model = lambda history, n: greedy_continuation(runner, history, n)
    h = Harness(config(), runner)
    rid = h.add(prompt, 120, speculative=DRAFT, sampling=greedy())
    h.run()
    decodes = [c for out in runner.steps for c in out.chunks if c.sample]
    assert all(c.n_draft > 0 for c in decodes[1:-1]), [c.n_draft for c in decodes]
    assert h.token_ids(rid) == greedy_reference(prompt, 120)


def greedy_continuation(runner: FakeRunner, history: list[int], n: int) -> list[int]:
    h, out = list(history), []
    for _ in range(n):
        out.append(runner.next_token(h))
        h.append(out[-1])
    return out


def greedy_reference(prompt: list[int], n: int) -> list[int]:
    h = Harness(config(), FakeRunner())
    rid = h.add(prompt, n, sampling=greedy())
    h.run()
    return h.token_ids(rid)


def test_request_override_and_the_engine_default() -> None:
    doc = document(200, seed=15)
    prompt = [*doc, 27, *doc[:30]]
    runner = copying_runner(prompt, 30, 60)
    h = Harness(config(speculative=SpecParams("ngram-simple", 16)), runner)
    on = h.add(prompt, 50, sampling=greedy())
    off = h.add(prompt, 50, sampling=greedy(), speculative=SpecRequest("none"))
    h.run()
    assert h.final(on).timings.draft_n > 0  # type: ignore[union-attr]
    assert h.final(off).timings.draft_n == 0  # type: ignore[union-attr]
    assert h.token_ids(on) == h.token_ids(off)


def test_draft_type_without_a_draft_model_is_rejected() -> None:
    h = Harness(config(draft_model=False), FakeRunner())
    with pytest.raises(RequestRejected, match="draft model"):
        h.add([1, 2, 3], 5, speculative=DRAFT)
    with pytest.raises(ValueError, match="draft model"):
        config(draft_model=False, speculative=SpecParams("draft"))


def test_bad_spec_params_are_refused() -> None:
    with pytest.raises(ValueError, match="type"):
        SpecRequest("ngram-cache")
    with pytest.raises(ValueError, match="n_max"):
        SpecRequest(n_max=1000)
    h = Harness(config(), FakeRunner())
    with pytest.raises(RequestRejected, match="n_min"):
        h.add([1, 2, 3], 5, speculative=SpecRequest("ngram-simple", n_max=2, n_min=4))
    with pytest.raises(ValueError, match="n_min"):
        SpecParams("ngram-simple", n_max=2, n_min=4)


def test_ngram_simple_takes_the_latest_match() -> None:
    d = NgramSimple(size_n=3, size_m=4)
    d.begin("r", [])
    history = [9, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 14, 15, 16, 17, 18, 1, 2, 3]
    assert d.propose("r", history, 16) == [14, 15, 16, 17]
    assert d.propose("r", history, 2) == []  # shorter than the n-gram: none, as llama.cpp
    assert d.propose("r", [*history, 99], 16) == []


def test_ngram_simple_drafts_a_loop_shorter_than_its_n_gram() -> None:
    """A period-2 loop with n = 3: the latest match is one period back, followed by one token (too
    few; llama.cpp stops there and drafts nothing), so the match a period earlier is the draft."""
    d = NgramSimple(size_n=3, size_m=4)
    d.begin("r", [])
    history = [9, 8, 7, 6, 5, 4, 3, 2] + [1, 2] * 5
    assert d.propose("r", history, 16) == [1, 2, 1]
    assert d.propose("r", [*history, 1], 16) == [2, 1, 2]
    assert d.propose("r", history, 2) == []  # a draft under the n-gram's length is never offered


def test_ngram_mod_chains_through_its_table() -> None:
    d = NgramMod(n_match=2, n_max=5, n_min=2)
    d.begin("r", [1, 2, 3, 4, 5, 6, 7])
    assert d.propose("r", [8, 1, 2], 16) == [3, 4, 5, 6, 7]
    assert d.propose("r", [8, 6, 7], 16) == []  # nothing followed 6 7
    d.begin("s", [1, 2, 3])
    assert d.propose("s", [5, 1, 2], 16) == [3, 4, 5, 6, 7]  # the table is shared
