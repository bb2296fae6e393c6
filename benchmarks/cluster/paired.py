"""Scenario (a)'s paired measure at 1 stream: serve and the gateway take turns, request by request.

(a)'s rounds run each arm for a minute or more at a time, and on a small VM the machine's own speed
drifts between them by more than the 2 ms target (the control arm, a second serve, shows by how
much). Here one user sends each prompt to serve and to the gateway back to back, the order
swapped every pair, so both arms see the same machine within a second: the median of the
per-pair differences (gateway - serve) resolves the path's added TTFT to a fraction of a
millisecond. Same workload as (a): `outpost bench`'s chat prompts, the same output lengths.
"""

from __future__ import annotations

import asyncio
import statistics
from contextlib import AsyncExitStack
from typing import Any

from benchmarks.cluster.common import Ctx, chat_config, ms
from benchmarks.harness.common import log
from outpost.bench.client import PATHS, request_body, send
from outpost.bench.prompts import Prompt, build_prompts
from outpost.bench.records import RequestRecord
from outpost.bench.runner import Connected, connect, prompt_builder
from outpost.bench.stats import percentile


async def _one(server: Connected, prompt: Prompt, extra: dict[str, Any], timeout: float) -> RequestRecord:
    info = server.info
    body = request_body("chat", info.model, prompt.system, prompt.text, prompt.max_tokens, info.accepted)
    record = RequestRecord(prompt.index, 0.0, prompt.input_tokens, prompt.max_tokens)
    return await send(server.client, PATHS["chat"], {**body, **extra}, record, timeout)


async def _pairs(ctx: Ctx, serve_url: str, gateway_url: str, n: int) -> list[tuple[float, float]]:
    """(serve TTFT, gateway TTFT) in seconds for each of `n` prompts both answered."""
    urls = {"serve": serve_url, "gateway": gateway_url}
    config = chat_config(ctx, urls, "1", n, 0, ctx.args.a_output_std)
    extra = dict(config.extra_body)
    out: list[tuple[float, float]] = []
    async with AsyncExitStack() as stack:
        serve, gateway = [await connect(t, config, stack) for t in config.targets]
        builder, _ = await prompt_builder(serve, config)
        prompts = await build_prompts(builder, config.scenario, f"paired:{config.seed}", n)
        for i, prompt in enumerate(prompts):
            first, second = (serve, gateway) if i % 2 == 0 else (gateway, serve)
            a = await _one(first, prompt, extra, config.timeout)
            b = await _one(second, prompt, extra, config.timeout)
            by_label = {first.info.label: a, second.info.label: b}
            s, g = by_label["serve"], by_label["gateway"]
            if s.ok and g.ok and s.ttft_s is not None and g.ttft_s is not None:
                out.append((s.ttft_s, g.ttft_s))
    return out


def paired_one_stream(ctx: Ctx, serve_url: str, gateway_url: str) -> dict[str, Any]:
    """--a-paired prompts, each to serve and to the gateway back to back: the added TTFT per pair."""
    n = ctx.args.a_paired
    log(f"(a) paired, 1 stream: {n} prompts, each to serve and to the gateway back to back")
    pairs = asyncio.run(_pairs(ctx, serve_url, gateway_url, n))
    if not pairs:
        return {"pairs": 0}
    added = sorted(g - s for s, g in pairs)
    return {
        "pairs": len(pairs),
        "serve_ttft_ms_p50": ms(statistics.median(s for s, _ in pairs)),
        "gateway_ttft_ms_p50": ms(statistics.median(g for _, g in pairs)),
        "added_ttft_ms": {
            "p50": ms(statistics.median(added)),
            "p10": ms(percentile(added, 10)),
            "p90": ms(percentile(added, 90)),
            "p99": ms(percentile(added, 99)),
        },
    }
