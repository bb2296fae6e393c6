"""The prefill budget's trade-off in raw llama_decode steps, without the engine loop or asyncio.

Not a test. Run:  python -m benchmarks.prefill replay [--budgets none,256,128,64,32,15] [--streams 7]
                  [--depth 150] [--prompt-tokens 2000] [--threads 1] [--flash-attn auto]

Replays the batches the scheduler makes while one long prompt is read beside `--streams`
generating streams (each at `--depth` tokens, one token a step) with each prefill budget, and
times every step: the streams' ITL is the step time, the prompt's TTFT the sum of its steps.
Also times the streams' decode step alone and the prompt alone in n_batch chunks, and prints what
`--prefill-budget auto` would choose here. Every budget starts from the same fresh KV cache. The
figures behind outpost/scheduler/budget.py; benchmarks/prefill/budget.py measures the same through
the whole engine. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from benchmarks.harness.common import bench_model, log
from outpost.engine.config import EngineConfig
from outpost.engine.executor import ModelRunner
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.budget import budget_floor, choose_prefill_budget
from outpost.scheduler.output import BatchChunk

PROMPT_SEQ = 7  # the streams are sequences 0..streams-1


class Replay:
    def __init__(self, runner: ModelRunner, args: argparse.Namespace) -> None:
        self.runner, self.args = runner, args

    def step(self, chunks: list[BatchChunk]) -> float:
        self.runner.batch.fill(chunks)
        started = time.perf_counter()
        status = llama.llama_decode(self.runner.model.ctx, self.runner.batch.struct)
        elapsed = time.perf_counter() - started
        if status != 0:
            raise RuntimeError(f"llama_decode failed with {status}")
        return elapsed

    def fresh_streams(self) -> None:
        llama.llama_memory_clear(self.runner.model.memory, False)
        for s in range(self.args.streams):
            self.step([BatchChunk(s, [5 + (i + s) % 50 for i in range(self.args.depth)], 0, True)])

    def prompt_steps(self, budget: int, with_streams: bool) -> list[float]:
        """Step times until the prompt's last chunk, each with one token of every stream."""
        times, pos, depth, n_prompt = [], 0, self.args.depth, self.args.prompt_tokens
        streams = range(self.args.streams) if with_streams else range(0)
        while pos < n_prompt:
            n = min(budget, n_prompt - pos)
            chunks = [BatchChunk(s, [7], depth, True) for s in streams]
            chunks.append(BatchChunk(PROMPT_SEQ, [9 + i % 40 for i in range(n)], pos, pos + n == n_prompt))
            times.append(self.step(chunks))
            pos, depth = pos + n, depth + 1
        return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--budgets", default="none,256,128,64,32,15", help="none = no cap (n_batch)")
    p.add_argument("--streams", type=int, default=7, help="at most 7: the prompt is sequence 7")
    p.add_argument("--depth", type=int, default=150, help="tokens each stream holds when the prompt arrives")
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto")
    args = p.parse_args()
    path = str(bench_model(args.shape, "q4_0"))
    config = EngineConfig(
        model_path=path, n_ctx=16384, n_seq_max=8, n_threads=args.threads, flash_attn=args.flash_attn
    )
    model = LoadedModel(config)
    try:
        runner = ModelRunner(model)
        times = runner.measure_step_times()
        floor = budget_floor(config.effective_n_ubatch, args.flash_attn != "off")
        log(choose_prefill_budget(times, model.n_batch, floor).describe())
        replay = Replay(runner, args)
        replay.fresh_streams()
        streams = range(args.streams)
        alone = [replay.step([BatchChunk(s, [7], args.depth + k, True) for s in streams]) for k in range(5)]
        out: dict[str, Any] = {"decode_alone_ms": round(float(np.median(alone)) * 1e3, 1)}
        replay.fresh_streams()
        out["prompt_alone_s"] = round(sum(replay.prompt_steps(model.n_batch, with_streams=False)), 2)
        log(str(out))
        for name in args.budgets.split(","):
            replay.fresh_streams()
            budget = model.n_batch - args.streams if name == "none" else int(name)
            steps = np.array(replay.prompt_steps(budget, with_streams=True))
            out[name] = {
                "steps": len(steps),
                "ttft_s": round(float(steps.sum()), 2),
                "itl_p50_ms": round(float(np.percentile(steps, 50)) * 1e3),
                "itl_p99_ms": round(float(np.percentile(steps, 99)) * 1e3),
            }
            log(f"budget {name}: {out[name]}")
    finally:
        model.close()
    print(json.dumps(out))
    return 0
