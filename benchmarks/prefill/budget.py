"""Decode latency while long prompts arrive: ITL of generating streams with and without a prefill budget.

Not a test. Run:  python -m benchmarks.prefill budget [--shape smollm2-135m] [--budgets none,auto,128]
                  [--streams 7] [--prompt-tokens 2000] [--seconds 20] [--threads 2]

A fresh engine (8 slots, synthetic q4_0 model) per round, so no round inherits another's KV cells
(in one KV pool every token attends over every cell up to the highest in use): `--streams`
requests generate without end, alone for `--alone-seconds` (the ITL yardstick), then while one
`--prompt-tokens` prompt after another arrives in the eighth slot (closed loop, one at a time).
`--budgets` names each round's `--prefill-budget`: none (no cap: n_batch), auto (the engine
measures its step times at start and chooses; outpost/scheduler/budget.py) or a number; repeat
names to alternate rounds. Reported per round: the budget it ran with, ITL p50/p99/max of the
generating streams (seconds between their token events, divided by the tokens in the event) and
p99 over their ITL alone, their aggregate tok/s, and TTFT p50/max of the long prompts (what the
budget costs them) and p50 over the TTFT of one long prompt on an idle engine (measured once,
first). The last stdout line is one JSON object keyed by round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import numpy as np

from benchmarks.harness.common import bench_model, log
from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams
from outpost.scheduler.budget import Asked, parse_prefill_budget
from outpost.serving.assembly import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def _asked(name: str) -> Asked:
    return "off" if name == "none" else parse_prefill_budget(name)


def _long_prompt(engine: Engine, tag: str, n: int) -> list[int]:
    """n tokens whose prefix is their own from the tag on (nothing from the prefix cache)."""
    words = " ".join(f"w{(j * 7) % 997}" for j in range(n))
    return engine.tokenize_prompt(f"{tag}: {words}")[:n]


async def _ttft(engine: Engine, tokens: list[int]) -> float:
    started = time.perf_counter()
    async for event in engine.client.generate(GenerateRequest(tokens, 1, GREEDY)):
        if event.token_ids:
            return time.perf_counter() - started
    raise RuntimeError("the long prompt ended without a token")


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
            ttfts.append(await _ttft(engine, _long_prompt(engine, f"Prompt {k}", args.prompt_tokens)))
            k += 1

    streams = [asyncio.ensure_future(stream(i)) for i in range(args.streams)]
    while len(started_streams) < args.streams:  # all generate before the first long prompt arrives
        await asyncio.sleep(0.05)
    gaps.clear()
    await asyncio.sleep(args.alone_seconds)
    itl_alone = float(np.median(gaps)) if gaps else float("nan")
    gaps.clear()
    decoded = 0
    started = time.perf_counter()
    prompts = asyncio.ensure_future(long_prompts())
    await asyncio.sleep(args.seconds)
    stop.set()
    elapsed = time.perf_counter() - started
    await asyncio.gather(*streams, prompts)
    while engine.core.scheduler.has_work():  # the streams' aborts reach this loop before it closes
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)
    g = np.array(gaps or [float("nan")])
    return {
        "itl_alone_p50_ms": round(itl_alone * 1000, 1),
        "itl_p50_ms": round(float(np.percentile(g, 50)) * 1000, 1),
        "itl_p99_ms": round(float(np.percentile(g, 99)) * 1000, 1),
        "itl_max_ms": round(float(g.max()) * 1000, 1),
        "itl_p99_x_alone": round(float(np.percentile(g, 99)) / itl_alone, 2),
        "stream_tok_s": round(decoded / elapsed, 1),
        "long_prompts": len(ttfts),
        "long_ttft_p50_s": round(float(np.median(ttfts)), 2) if ttfts else None,
        "long_ttft_max_s": round(float(max(ttfts)), 2) if ttfts else None,
        "ttfts": [round(t, 2) for t in ttfts],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument(
        "--budgets",
        default="none,auto,128",
        help="comma-separated --prefill-budget values, one round each: none (no cap), auto, or a number",
    )
    p.add_argument("--streams", type=int, default=7)
    p.add_argument("--prompt-tokens", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--alone-seconds", type=float, default=5.0, help="streams alone first: the ITL yardstick")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    model = bench_model(args.shape, "q4_0")
    config = EngineConfig(model_path=str(model), n_ctx=16384, n_seq_max=8, n_threads=args.threads)
    with Engine(config, prefill_budget="off") as engine:
        alone = asyncio.run(_ttft(engine, _long_prompt(engine, "Alone", args.prompt_tokens)))
    log(f"one {args.prompt_tokens}-token prompt on an idle engine: TTFT {alone:.2f} s")
    results: dict[str, Any] = {"ttft_alone_s": round(alone, 2)}
    for i, name in enumerate(args.budgets.split(",")):
        with Engine(config, prefill_budget=_asked(name)) as engine:
            budget = engine.prefill_budget
            log(f"round {i}: {budget.describe()}; {args.streams} streams, {args.prompt_tokens}-token prompts")
            row = asyncio.run(_measure(engine, args))
        ttft = row["long_ttft_p50_s"]
        row["long_ttft_p50_x_alone"] = round(ttft / alone, 2) if ttft is not None else None
        results[f"{name}#{i}"] = {"budget": budget.tokens, **row}
        log(f"  {results[f'{name}#{i}']}")
    print(json.dumps(results))
    return 0
