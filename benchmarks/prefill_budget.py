"""Decode latency while long prompts arrive: ITL of generating streams with and without a prefill budget.

Not a test. Run:  python benchmarks/prefill_budget.py [--shape smollm2-135m] [--budgets none,128]
                  [--streams 7] [--prompt-tokens 2000] [--seconds 20] [--threads 2]

One engine (8 slots, synthetic q4_0 model) per budget: `--streams` requests generate without end
while one `--prompt-tokens` prompt after another arrives in the eighth slot (closed loop, one at
a time). Reported per budget: ITL p50/p99/max of the generating streams (seconds between their
token events, divided by the tokens in the event), their aggregate tok/s, and TTFT p50 of the long
prompts (what the budget costs them). The last stdout line is one JSON object keyed by budget.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from typing import Any

import numpy as np
from common import bench_model, log

from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams
from outpost.runtime import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def _set_budget(engine: Engine, budget: int | None) -> None:
    """The scheduler's prefill budget, set while idle (Engine builds its config from n_batch)."""
    scheduler = engine.core.scheduler
    scheduler.config = dataclasses.replace(scheduler.config, prefill_budget=budget)


async def _measure(engine: Engine, args: argparse.Namespace) -> dict[str, Any]:
    stop = asyncio.Event()
    started_streams: set[int] = set()
    gaps: list[float] = []
    decoded = 0
    ttfts: list[float] = []

    async def stream(i: int) -> None:
        nonlocal decoded
        req = GenerateRequest(engine.tokenize_prompt(f"Stream {i} tells a long story"), 100_000, GREEDY)
        last = None
        async for event in engine.client.generate(req):
            now = time.perf_counter()
            n = len(event.token_ids)
            if n and last is not None and not stop.is_set():
                gaps.extend([(now - last) / n] * n)
                decoded += n
            if n:
                last = now
                started_streams.add(i)
            if stop.is_set():
                break

    async def long_prompts() -> None:
        k = 0
        while not stop.is_set():
            words = " ".join(f"w{(k * 7 + j) % 997}" for j in range(args.prompt_tokens))
            tokens = engine.tokenize_prompt(f"Prompt {k}: {words}")[: args.prompt_tokens]
            k += 1
            started = time.perf_counter()
            async for event in engine.client.generate(GenerateRequest(tokens, 1, GREEDY)):
                if event.token_ids:
                    ttfts.append(time.perf_counter() - started)

    streams = [asyncio.ensure_future(stream(i)) for i in range(args.streams)]
    while len(started_streams) < args.streams:  # all generate before the first long prompt arrives
        await asyncio.sleep(0.05)
    gaps.clear()
    decoded = 0
    started = time.perf_counter()
    prompts = asyncio.ensure_future(long_prompts())
    await asyncio.sleep(args.seconds)
    stop.set()
    elapsed = time.perf_counter() - started
    await asyncio.gather(*streams, prompts)
    g = np.array(gaps or [float("nan")])
    return {
        "itl_p50_ms": round(float(np.percentile(g, 50)) * 1000, 1),
        "itl_p99_ms": round(float(np.percentile(g, 99)) * 1000, 1),
        "itl_max_ms": round(float(g.max()) * 1000, 1),
        "stream_tok_s": round(decoded / elapsed, 1),
        "long_prompts": len(ttfts),
        "long_ttft_p50_s": round(float(np.median(ttfts)), 2) if ttfts else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--budgets", default="none,128", help="comma-separated; none = no cap (n_batch)")
    p.add_argument("--streams", type=int, default=7)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    model = bench_model(args.shape, "q4_0")
    config = EngineConfig(model_path=str(model), n_ctx=16384, n_seq_max=8, n_threads=args.threads)
    results: dict[str, Any] = {}
    with Engine(config) as engine:
        for i, name in enumerate(args.budgets.split(",")):  # repeat a budget to alternate rounds
            budget = None if name == "none" else int(name)
            _set_budget(engine, budget)
            log(
                f"budget {name}: {args.streams} streams, {args.prompt_tokens}-token prompts, {args.seconds} s"
            )
            key = f"{name}#{i}"
            results[key] = asyncio.run(_measure(engine, args))
            log(f"  {results[key]}")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
