"""The host sampler against llama.cpp's own sampler chain on a real context (synthetic GGUF): the same
distribution from the same logits row (a two-sample chi-square over seeds), and the runner's
batched step gives each sequence what it would draw alone, next to sequences the native chain samples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.executor import ModelRunner
from outpost.engine.host_sampling import HostSampler
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.engine.sampling import SamplerChain
from outpost.messages import SamplingParams
from outpost.scheduler.output import BatchChunk, SamplerSetup, SchedulerOutput

# Hotter than the defaults, so that the tiny model's peaked rows (98% on one token) leave several
# tokens to draw; the second set cuts with top-p and min-p (at temperature 1, before it is applied).
PARAMS = SamplingParams(temperature=3.0, top_k=20, top_p=1.0, min_p=0.0)
CUTTING = SamplingParams(temperature=3.0, top_k=40, top_p=0.9995, min_p=0.001, ignore_eos=True)
DRAWS = 3000
CRITICAL_P001 = {df: df * (1 - 2 / (9 * df) + 3.09 * (2 / (9 * df)) ** 0.5) ** 3 for df in range(1, 200)}


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Iterator[LoadedModel]:
    loaded = LoadedModel(EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_seq_max=8, n_batch=512))
    yield loaded
    loaded.close()


def _prompt(model: LoadedModel, i: int) -> list[int]:
    return model.vocab.tokenize(f"Story {i}: the river carried copper light past", add_special=False)


def _decoded_row_index(model: LoadedModel) -> int:
    llama.llama_memory_clear(model.memory, True)
    batch = TokenBatch(512)
    outputs = batch.fill([BatchChunk(0, _prompt(model, 0), 0, True)])
    assert llama.llama_decode(model.ctx, batch.struct) == 0
    return outputs[0]


def two_sample_chi_square_fails(a: Counter[int], b: Counter[int]) -> bool:
    """Homogeneity of two samples at p = 0.001; tokens expected fewer than 5 times pooled."""
    na, nb = sum(a.values()), sum(b.values())
    cells: dict[object, tuple[int, int]] = {}
    for t in set(a) | set(b):
        key = t if (a[t] + b[t]) * min(na, nb) / (na + nb) >= 5 else "rare"
        x, y = cells.get(key, (0, 0))
        cells[key] = (x + a[t], y + b[t])
    stat = 0.0
    for x, y in cells.values():
        ea, eb = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ea) ** 2 / ea + (y - eb) ** 2 / eb
    return len(cells) > 1 and stat > CRITICAL_P001[len(cells) - 1]


def _draw_counts(
    model: LoadedModel, index: int, params: SamplingParams, host: HostSampler | None
) -> Counter[int]:
    vocab = model.vocab
    counts: Counter[int] = Counter()
    for seed in range(DRAWS):
        chain = SamplerChain(replace(params, seed=seed), vocab.handle, vocab.n_tokens, vocab.eog_ids, host)
        assert (chain.host is not None) == (host is not None)
        counts[chain.sample(model.ctx, index)] += 1
        chain.free()
    return counts


@pytest.mark.parametrize("params", [PARAMS, CUTTING])
def test_host_draws_follow_the_native_chains_distribution(model: LoadedModel, params: SamplingParams) -> None:
    index = _decoded_row_index(model)
    native = _draw_counts(model, index, params, None)
    host = _draw_counts(model, index, params, HostSampler(model.vocab.n_tokens))
    assert len(native) >= 3  # a distribution worth comparing, not one token
    assert not two_sample_chi_square_fails(native, host)
    assert two_sample_chi_square_fails(
        native, _draw_counts(model, index, replace(params, temperature=0.3), None)
    )


def test_a_batched_step_draws_what_each_sequence_draws_alone(model: LoadedModel) -> None:
    """Eight sequences in one step, two of them on the native chain (a penalty, a grammar): each
    token is what a fresh chain with that sequence's seed draws from its row of the same decode,
    so rows, seeds and tokens line up in the batched call."""
    native = {2: replace(PARAMS, repeat_penalty=1.2), 5: replace(PARAMS, grammar='root ::= [a-z ]+ "."')}
    params = {seq: replace(native.get(seq, PARAMS), seed=1000 + seq) for seq in range(8)}
    prompts = [_prompt(model, seq) for seq in range(8)]
    rows = np.cumsum([len(p) for p in prompts]) - 1  # each prompt's last token: its output row
    vocab = model.vocab
    runner = ModelRunner(model)
    try:
        for trial in range(3):
            llama.llama_memory_clear(model.memory, True)
            setups = [SamplerSetup(seq, f"{trial}-{seq}", params[seq]) for seq in range(8)]
            chunks = [BatchChunk(seq, prompts[seq], 0, True) for seq in range(8)]
            out = runner.execute(SchedulerOutput(sampler_setups=setups, chunks=chunks))
            host = HostSampler(vocab.n_tokens)
            for seq in range(8):
                alone = SamplerChain(params[seq], vocab.handle, vocab.n_tokens, vocab.eog_ids, host)
                assert out.sampled[seq].token == alone.sample(model.ctx, int(rows[seq]))
                alone.free()
            runner.execute(SchedulerOutput(sampler_drops=[f"{trial}-{seq}" for seq in range(8)]))
        assert not runner.chains
    finally:
        runner.close()


def test_finite_logit_biases_draw_as_the_native_chain_does(model: LoadedModel) -> None:
    """Finite biases (a large push down on the row's top token, a small one on the next, one up
    from far below): the host samples such a chain (not the native one) with the native
    distribution."""
    index = _decoded_row_index(model)
    order = np.argsort(-model.output_logits(index))
    bias = ((int(order[0]), -100.0), (int(order[1]), -1.0), (int(order[500]), 4.0))
    params = replace(PARAMS, logit_bias=bias)
    native = _draw_counts(model, index, params, None)
    host = _draw_counts(model, index, params, HostSampler(model.vocab.n_tokens))
    assert int(order[0]) not in native and int(order[0]) not in host
    assert len(native) >= 3
    assert not two_sample_chi_square_fails(native, host)
    assert two_sample_chi_square_fails(native, _draw_counts(model, index, PARAMS, None))
