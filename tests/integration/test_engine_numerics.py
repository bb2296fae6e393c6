"""Batched and cached decoding give the same logits as a lone, cold decode (real llama.cpp, tiny model).

CPU kernels reorder float sums when the batch shape changes, so logits are compared within a
tolerance, and tokens only where the top-1 margin is clear. The tiny model's random init is large
enough that logits are peaked (its margin is checked here too, or the comparison would mean nothing).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.executor import ModelRunner
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.output import BatchChunk, SchedulerOutput, SeqCopy

LOGIT_ATOL = 0.05  # absolute; the logits' spread is several units (checked below)
CLEAR_MARGIN = 0.2  # top-1 minus top-2 beyond which argmax must not flip


def _prompts(model: LoadedModel, n: int) -> list[list[int]]:
    words = "river stone quiet market engine lantern orchard signal harbor copper meadow".split()
    prompts = []
    for i in range(n):
        text = " ".join(words[(i + j) % len(words)] for j in range(12 + 3 * i))
        prompts.append(model.vocab.tokenize(f"Story {i}: {text}", add_special=False))
    return prompts


def _decode(model: LoadedModel, batch: TokenBatch, chunks: list[BatchChunk]) -> dict[int, np.ndarray]:
    outputs = batch.fill(chunks)
    assert llama.llama_decode(model.ctx, batch.struct) == 0
    return {seq: model.output_logits(index) for seq, index in outputs.items()}


def _assert_close(a: np.ndarray, b: np.ndarray) -> None:
    assert np.max(np.abs(a - b)) < LOGIT_ATOL
    top2 = np.sort(a)[-2:]
    if top2[1] - top2[0] > CLEAR_MARGIN:
        assert int(np.argmax(a)) == int(np.argmax(b))


@pytest.fixture(scope="module")
def model(tiny_model: Path):
    loaded = LoadedModel(EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_seq_max=8, n_batch=512))
    yield loaded
    loaded.close()


def _clear(model: LoadedModel) -> None:
    llama.llama_memory_clear(model.memory, True)


def test_tiny_logits_are_peaked(model: LoadedModel) -> None:
    batch = TokenBatch(512)
    margins = []
    for prompt in _prompts(model, 8):
        _clear(model)
        logits = _decode(model, batch, [BatchChunk(0, prompt, 0, True)])[0]
        top2 = np.sort(logits)[-2:]
        margins.append(top2[1] - top2[0])
        assert np.std(logits) > 1.0
    assert np.median(margins) > CLEAR_MARGIN


def test_prompt_alone_matches_prompt_inside_batch_of_8(model: LoadedModel) -> None:
    batch = TokenBatch(512)
    prompts = _prompts(model, 8)
    alone = {}
    for seq, prompt in enumerate(prompts):
        _clear(model)
        alone[seq] = _decode(model, batch, [BatchChunk(seq, prompt, 0, True)])[seq]
    _clear(model)
    together = _decode(model, batch, [BatchChunk(seq, p, 0, True) for seq, p in enumerate(prompts)])
    for seq in range(8):
        _assert_close(alone[seq], together[seq])


@pytest.mark.parametrize("kv_unified", ["on", "off"])
def test_prefix_copied_from_another_sequence_matches_cold(tiny_model: Path, kv_unified: str) -> None:
    config = EngineConfig(model_path=str(tiny_model), n_ctx=2048, n_seq_max=8, kv_unified=kv_unified)
    with LoadedModel(config) as model:
        assert model.kv_unified == (kv_unified == "on")
        assert model.n_ctx_seq == (2048 if kv_unified == "on" else 256)
        _check_prefix_copy(model)


def _check_prefix_copy(model: LoadedModel) -> None:
    batch = TokenBatch(512)
    shared = _prompts(model, 8)[7]
    suffix = model.vocab.tokenize(" and then the harbor lights went out", add_special=False)
    _clear(model)
    cold = _decode(model, batch, [BatchChunk(0, shared + suffix, 0, True)])[0]
    _clear(model)
    _decode(model, batch, [BatchChunk(1, shared, 0, True)])
    # Through the runner: a unified cache shares the cells, a stream per slot copies them.
    ModelRunner(model).execute(SchedulerOutput(memory_ops=[SeqCopy(1, 2, 0, len(shared))]))
    warm = _decode(model, batch, [BatchChunk(2, suffix, len(shared), True)])[2]
    _assert_close(cold, warm)


@pytest.mark.parametrize("bias", ["none", "ban-top", "ban-other", "boost-other", "ban-and-boost"])
def test_argmax_greedy_picks_what_the_native_greedy_chain_picks(model: LoadedModel, bias: str) -> None:
    """The argmax shortcut for plain greedy must agree with llama.cpp's own chain, biases included:
    banning the top token (as ignore_eos bans EOG) moves both to the runner-up, banning another
    changes nothing, and boosting the weakest token past the top makes it win, with or without a
    ban beside it (bans alone take a shortcut)."""
    from outpost.engine.sampling import SamplerChain, is_plain_greedy
    from outpost.messages import SamplingParams

    _clear(model)
    batch = TokenBatch(512)
    logits = _decode(model, batch, [BatchChunk(0, _prompts(model, 1)[0], 0, True)])[0]
    order = np.argsort(logits)
    top, runner_up, weakest = int(order[-1]), int(order[-2]), int(order[0])
    boost = float(logits[top] - logits[weakest]) + 1.0
    biases, expected = {
        "none": ((), top),
        "ban-top": (((top, float("-inf")),), runner_up),
        "ban-other": (((runner_up, float("-inf")),), top),
        "boost-other": (((weakest, boost),), weakest),
        "ban-and-boost": (((runner_up, float("-inf")), (weakest, boost)), weakest),
    }[bias]
    params = SamplingParams(temperature=0.0, logit_bias=biases)
    native_params = SamplingParams(temperature=0.0, logit_bias=biases, repeat_penalty=1.0001)
    assert is_plain_greedy(params) and not is_plain_greedy(native_params)
    vocab = model.vocab
    fast = SamplerChain(params, vocab.handle, vocab.n_tokens, vocab.eog_ids)
    native = SamplerChain(native_params, vocab.handle, vocab.n_tokens, vocab.eog_ids)
    index = int(batch.struct.n_tokens) - 1
    try:
        picked = fast.sample(model.ctx, index)
        assert picked == native.sample(model.ctx, index)
        assert picked == expected
    finally:
        fast.free()
        native.free()
