"""Backend sampling (llama.cpp samples in its graph; `--backend-sampling`) on the CPU backend with a
synthetic GGUF: greedy tokens identical to the host path's, sampled first tokens from the same
distribution (a two-sample chi-square over seeds), chains it cannot do exactly sampled on the host in
the same step, and a chain whose request moves to another slot sampled on the host from then on."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from test_host_sampling_engine import two_sample_chi_square_fails

from outpost.engine.config import EngineConfig
from outpost.engine.executor import ModelRunner
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.messages import SamplingParams
from outpost.scheduler.output import BatchChunk, MemoryOp, SamplerSetup, SchedulerOutput, SeqCopy, SeqRemove

GREEDY = SamplingParams(temperature=0.0)
HOT = SamplingParams(temperature=3.0, top_k=20, top_p=0.9995, min_p=0.001)  # several tokens to draw
GRAMMAR = replace(HOT, grammar='root ::= "yes" | "no"')
N_SEQ = 8


def _runner(tiny_model: Path, backend: str) -> Iterator[ModelRunner]:
    config = EngineConfig(
        model_path=str(tiny_model), n_ctx=2048, n_seq_max=N_SEQ, n_batch=512, backend_sampling=backend
    )
    with LoadedModel(config) as model:
        runner = ModelRunner(model)
        yield runner
        runner.close()


@pytest.fixture(scope="module")
def in_graph(tiny_model: Path) -> Iterator[ModelRunner]:
    yield from _runner(tiny_model, "on")


@pytest.fixture(scope="module")
def on_host(tiny_model: Path) -> Iterator[ModelRunner]:
    yield from _runner(tiny_model, "off")


def _prompt(runner: ModelRunner, i: int) -> list[int]:
    return runner.model.vocab.tokenize(f"Story {i}: the river carried copper light past", add_special=False)


def _generate(
    runner: ModelRunner, params: list[SamplingParams], steps: int, tag: str
) -> dict[int, list[int]]:
    """Each sequence's prompt, then `steps` tokens, all sequences in every step; chains dropped after."""
    llama.llama_memory_clear(runner.model.memory, True)
    setups = [SamplerSetup(seq, f"{tag}-{seq}", p) for seq, p in enumerate(params)]
    prompts = {seq: _prompt(runner, seq) for seq in range(len(params))}
    out = runner.execute(
        SchedulerOutput(sampler_setups=setups, chunks=[BatchChunk(s, p, 0, True) for s, p in prompts.items()])
    )
    tokens = {seq: [t.token] for seq, t in out.sampled.items()}
    for _ in range(steps - 1):
        chunks = [BatchChunk(s, [tokens[s][-1]], len(prompts[s]) + len(tokens[s]) - 1, True) for s in tokens]
        out = runner.execute(SchedulerOutput(chunks=chunks))
        assert out.error is None
        for seq, t in out.sampled.items():
            tokens[seq].append(t.token)
    runner.execute(SchedulerOutput(sampler_drops=[s.request_id for s in setups]))
    return tokens


def test_the_backend_samples_in_the_graph_only_when_asked(
    in_graph: ModelRunner, on_host: ModelRunner
) -> None:
    assert in_graph.backend_sampling and not on_host.backend_sampling
    assert "backend sampling on" in in_graph.describe_sampling()


def test_greedy_tokens_are_the_host_paths(in_graph: ModelRunner, on_host: ModelRunner) -> None:
    params = [GREEDY] * N_SEQ
    assert _generate(in_graph, params, 12, "g") == _generate(on_host, params, 12, "g")


def test_the_graph_sampled_the_tokens(in_graph: ModelRunner) -> None:
    """llama.cpp hands back a sampled token for each backend-sampled output, none for the host one."""
    llama.llama_memory_clear(in_graph.model.memory, True)
    setups = [SamplerSetup(0, "b0", HOT), SamplerSetup(1, "b1", GRAMMAR)]
    chunks = [BatchChunk(0, _prompt(in_graph, 0), 0, True), BatchChunk(1, _prompt(in_graph, 1), 0, True)]
    out = in_graph.execute(SchedulerOutput(sampler_setups=setups, chunks=chunks))
    assert in_graph.samplers[0].backend_seq == 0 and in_graph.samplers[1].backend_seq is None
    first_row = len(_prompt(in_graph, 0)) - 1
    assert llama.llama_get_sampled_token_ith(in_graph.model.ctx, first_row) == out.sampled[0].token
    assert _starts_yes_or_no(in_graph, out.sampled[1].token)
    in_graph.execute(SchedulerOutput(sampler_drops=["b0", "b1"]))


def _starts_yes_or_no(runner: ModelRunner, token: int) -> bool:
    """The grammar's first token: a non-empty start of "yes" or "no"."""
    piece = runner.model.vocab.token_to_piece(token)
    return bool(piece) and (b"yes".startswith(piece) or b"no".startswith(piece))


def _first_tokens(runner: ModelRunner, params: SamplingParams, rounds: int, tag: str) -> Counter[int]:
    """`rounds` x N_SEQ seeded first tokens after the same prompt: read once (all but its last
    token), copied to every slot each round; each slot then decodes the last token and samples."""
    llama.llama_memory_clear(runner.model.memory, True)
    prompt = _prompt(runner, 0)
    runner.execute(SchedulerOutput(chunks=[BatchChunk(N_SEQ - 1, prompt[:-1], 0, False)]))
    counts: Counter[int] = Counter()
    for r in range(rounds):
        ops: list[MemoryOp] = [SeqRemove(N_SEQ - 1, len(prompt) - 1)]
        ops += [SeqCopy(N_SEQ - 1, seq, 0, len(prompt) - 1) for seq in range(N_SEQ - 1)]
        setups = [SamplerSetup(s, f"{tag}{r}-{s}", replace(params, seed=r * N_SEQ + s)) for s in range(N_SEQ)]
        chunks = [BatchChunk(seq, prompt[-1:], len(prompt) - 1, True) for seq in range(N_SEQ)]
        out = runner.execute(SchedulerOutput(memory_ops=ops, sampler_setups=setups, chunks=chunks))
        counts.update(t.token for t in out.sampled.values())
        runner.execute(SchedulerOutput(sampler_drops=[s.request_id for s in setups]))
    return counts


def test_sampled_tokens_follow_the_host_paths_distribution(
    in_graph: ModelRunner, on_host: ModelRunner
) -> None:
    graph = _first_tokens(in_graph, HOT, 100, "s")
    host = _first_tokens(on_host, HOT, 100, "s")
    assert len(graph) >= 3
    assert not two_sample_chi_square_fails(graph, host)
    assert two_sample_chi_square_fails(graph, _first_tokens(on_host, replace(HOT, temperature=0.3), 100, "c"))


def test_a_request_resumed_in_another_slot_keeps_its_draws(
    in_graph: ModelRunner, on_host: ModelRunner
) -> None:
    """A request preempted after its first token and resumed in another slot draws what it draws
    without the move, in the graph there; its old slot's newcomer (a grammar, on the host) is not
    sampled by the chain that left."""

    def run(runner: ModelRunner, move: bool, tag: str) -> list[int]:
        llama.llama_memory_clear(runner.model.memory, True)
        prompt = _prompt(runner, 0)
        params = replace(HOT, seed=5)
        out = runner.execute(
            SchedulerOutput(
                sampler_setups=[SamplerSetup(0, tag, params)], chunks=[BatchChunk(0, prompt, 0, True)]
            )
        )
        tokens = [out.sampled[0].token]
        seq = 1 if move else 0
        if move:
            llama.llama_memory_seq_cp(runner.model.memory, 0, 1, -1, -1)
            llama.llama_memory_seq_rm(runner.model.memory, 0, -1, -1)
            newcomer = SamplerSetup(0, f"{tag}-new", GRAMMAR)
            runner.execute(SchedulerOutput(sampler_setups=[SamplerSetup(1, tag, params), newcomer]))
        for step in range(6):
            chunks = [BatchChunk(seq, [tokens[-1]], len(prompt) + len(tokens) - 1, True)]
            if move and step == 0:  # the newcomer's first token, in the same step
                chunks.append(BatchChunk(0, prompt, 0, True))
            out = runner.execute(SchedulerOutput(chunks=chunks))
            tokens.append(out.sampled[seq].token)
            if move and step == 0:
                assert _starts_yes_or_no(runner, out.sampled[0].token)
        if runner.backend_sampling:
            assert runner.chains[tag].backend_seq == seq
        runner.execute(SchedulerOutput(sampler_drops=[tag, f"{tag}-new"]))
        return tokens

    assert run(in_graph, True, "m") == run(in_graph, False, "s")
