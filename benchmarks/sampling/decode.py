"""Whole decode steps (llama_decode and sampling) with the sampler in llama.cpp's graph (backend
sampling) or on the host (outpost/engine/host_sampling.py): what `--backend-sampling`'s default
rests on. n sequences read one real prompt each, then decode one token per step; medians of
`steps` steps, the two modes alternating step blocks so that a shared machine's load falls on both."""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from benchmarks.sampling.capture import QUESTIONS, chat_prompt
from outpost.engine.config import EngineConfig
from outpost.engine.executor import ModelRunner
from outpost.engine.model import LoadedModel
from outpost.messages import SamplingParams
from outpost.scheduler.output import BatchChunk, SamplerSetup, SchedulerOutput


class Decoder:
    """n sequences generating on one model, the runner sampling in the graph or on the host."""

    def __init__(self, config: EngineConfig, backend: bool, n: int, params: SamplingParams) -> None:
        self.model = LoadedModel(config.model_copy(update={"backend_sampling": "on" if backend else "off"}))
        self.runner = ModelRunner(self.model)
        prompts = [chat_prompt(self.model, QUESTIONS[i % len(QUESTIONS)]) for i in range(n)]
        setups = [SamplerSetup(s, f"r{s}", replace(params, seed=s)) for s in range(n)]
        self.last: dict[int, int] = {}
        pending = [BatchChunk(s, p, 0, True) for s, p in enumerate(prompts)]
        while pending:  # as many whole prompts as fit a batch
            chunks = [pending.pop(0)]
            while (
                pending and sum(len(c.tokens) for c in chunks) + len(pending[0].tokens) <= self.model.n_batch
            ):
                chunks.append(pending.pop(0))
            out = self.runner.execute(SchedulerOutput(sampler_setups=setups, chunks=chunks))
            setups = []
            self.last.update({s: t.token for s, t in out.sampled.items()})
        self.pos = {s: len(p) for s, p in enumerate(prompts)}

    def step(self) -> float:
        chunks = [BatchChunk(s, [t], self.pos[s], True) for s, t in self.last.items()]
        t0 = time.perf_counter()
        out = self.runner.execute(SchedulerOutput(chunks=chunks))
        elapsed = (time.perf_counter() - t0) * 1e3
        if out.error:
            raise RuntimeError(out.error)
        self.last = {s: t.token for s, t in out.sampled.items()}
        self.pos = {s: p + 1 for s, p in self.pos.items()}
        return elapsed

    def close(self) -> None:
        self.runner.close()
        self.model.close()


def step_medians(config: EngineConfig, n: int, steps: int, params: SamplingParams) -> dict[str, float]:
    """Median ms per decode step, host sampler vs graph sampler, blocks of 5 steps alternating."""
    decoders = {"host": Decoder(config, False, n, params), "graph": Decoder(config, True, n, params)}
    times: dict[str, list[float]] = {name: [] for name in decoders}
    try:
        for _ in range(2):  # warm-up: the graph is reserved anew once samplers are attached
            for d in decoders.values():
                d.step()
        while len(times["host"]) < steps:
            for name, d in decoders.items():
                times[name] += [d.step() for _ in range(5)]
    finally:
        for d in decoders.values():
            d.close()
    return {name: statistics.median(t) for name, t in times.items()}
