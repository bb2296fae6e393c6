"""benchmarks/cluster/'s scenario (c): prefix-aware routing on vs off.

Two gateways (the closed-loop users alternate between them) in front of two workers whose KV
holds at most two of the workload's four system prompts. Shared-prefix workload: every request
takes one of 4 distinct ~`--prefix-tokens` system prompts at random, a short user turn
(`--turn-tokens`) and a short answer (`--turn-max-tokens`). Run with `--prefix-routing on` and
`off` on both gateways, fresh workers and gateways each time, the same prompts in the same order.
Hit rate = sum(timings.cache_n) / sum(usage.prompt_tokens) over the measured requests. Then the
same with no shared prefix (every request its own system prompt of the same length): throughput.

KV sizing (`-kvu on`: one pool of cells per worker, `--cache-idle-cells` = the pool, so idle
prefixes stay until the pool needs their cells): `-c` = 2.5 prefixes. Two prefixes fit, with half a
prefix's cells for the turns running beside them (a worker's share of the streams); a third
prefix never does (admitting it evicts the least recently used idle caches). More slots than
streams per worker (`--prefix-slots` 8): a slot holds one sequence, so idle slots are what keeps
a prefix whose requests are not running (with as many slots as requests, a new request's slot
often held the last copy of the other prefix).
"""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass
from typing import Any

from benchmarks.cluster.common import Ctx, closed_loop, ms, ratio, target
from benchmarks.harness.broker import Broker
from benchmarks.harness.common import log
from benchmarks.harness.procs import (
    cluster_counters,
    gateway,
    live_workers,
    running_broker,
    wait_workers,
    worker,
)
from outpost.bench.config import BenchConfig, ServerTarget, make_plan, make_scenario
from outpost.bench.progress import Progress
from outpost.bench.prompts import Fitted, Prompt, PromptBuilder
from outpost.bench.records import RequestRecord
from outpost.bench.runner import Connected, connect, prompt_builder
from outpost.bench.stats import summarise

N_PREFIXES = 4
TEMPLATE_TOKENS = 16  # what the chat template adds around a system prompt or a turn (about)
ROUTING_COUNTERS = ("routed_prefix", "routed_placed", "routed_shared", "lane_full", "resumes")


@dataclass
class Workload:
    """One variant's prompts: warmup (dropped) then measured, the same for routing on and off."""

    name: str  # "shared" | "distinct"
    warm: list[Prompt]
    measured: list[Prompt]


def kv_cells(args: Any) -> int:
    """Each worker's -c: 2.5 prefixes. Two prefixes and half a prefix's cells for the turns running
    beside them (shared prefix cells count once in one pool); a third prefix never fits."""
    if args.prefix_ctx:
        return int(args.prefix_ctx)
    prefix = int(args.prefix_tokens) + TEMPLATE_TOKENS
    turn = _span(args.turn_tokens)[1] + _span(args.turn_max_tokens)[1] + TEMPLATE_TOKENS
    cells = round(2.5 * prefix)
    per_worker = -(-args.prefix_streams // 2)
    if cells - 2 * prefix < per_worker * turn:
        log(f"(c): warning: -c {cells} leaves {cells - 2 * prefix} cells for {per_worker} turns of {turn}")
    return cells


def engine(ctx: Ctx) -> list[str]:
    a = ctx.args
    cells = kv_cells(a)
    flags = f"-t 1 -np {a.prefix_slots} -c {cells} -kvu on --cache-idle-cells {cells}"
    return ["-m", str(ctx.model), *flags.split()]


def _span(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(",")
    return int(lo), int(hi or lo)


async def build_workloads(builder: PromptBuilder, args: Any) -> list[Workload]:
    """The shared-prefix and the distinct workload, from --seed."""
    seed = f"cluster-c:{args.seed}"
    prefixes = [
        await builder.fit(random.Random(f"{seed}:prefix:{k}"), args.prefix_tokens) for k in range(N_PREFIXES)
    ]

    async def prompts(tag: str, count: int, distinct: bool) -> list[Prompt]:
        out = []
        for i in range(count):
            rng = random.Random(f"{seed}:{tag}:{i}")
            turn, answer = rng.randint(*_span(args.turn_tokens)), rng.randint(*_span(args.turn_max_tokens))
            choice = rng.randrange(N_PREFIXES)
            system: Fitted = (
                await builder.fit(random.Random(f"{seed}:{tag}:system:{i}"), args.prefix_tokens)
                if distinct
                else prefixes[choice]
            )
            user = await builder.fit(rng, turn)
            out.append(Prompt(i, system.text, user.text, system.tokens + user.tokens, answer))
        return out

    workloads = []
    for name in args.prefix_workloads.split(","):
        warm = await prompts(f"{name}:warm", args.prefix_warmup, name == "distinct")
        measured = await prompts(name, args.prefix_requests, name == "distinct")
        workloads.append(Workload(name, warm, measured))
    return workloads


def _config(ctx: Ctx, urls: list[str]) -> BenchConfig:
    return BenchConfig(
        targets=tuple(ServerTarget(url=u, label=f"gateway {i}") for i, u in enumerate(urls)),
        plan=make_plan(str(ctx.args.prefix_streams), None, 1, None, 0),
        scenario=make_scenario("custom", None, None),
        timeout=ctx.args.timeout,
        extra_body={"temperature": 0.8, **ctx.ban_eog()},
    )


def _hit_rate(records: list[RequestRecord]) -> float | None:
    ok = [r for r in records if r.ok and r.prompt_tokens]
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    return round(sum(r.cache_n or 0 for r in ok) / prompt, 4) if prompt else None


def _summary(records: list[RequestRecord], users: int) -> dict[str, Any]:
    s = summarise(
        records, label="2 gateways", url="", model="", mode="concurrency", level=users, capped=False
    )
    return {
        "requests_ok": s.requests_ok,
        "errors": s.errors,
        "errors_by_code": s.errors_by_code,
        "hit_rate": _hit_rate(records),
        "ttft_ms": {"p50": ms(s.ttft_s.p50), "p90": ms(s.ttft_s.p90), "p99": ms(s.ttft_s.p99)},
        "e2e_ms_p50": ms(s.e2e_s.p50),
        "output_tok_s": round(s.output_tok_s, 2),
        "total_tok_s": round(s.total_tok_s, 2),
        "requests_per_s": round(s.requests_per_s, 3),
        "duration_s": round(s.duration_s, 2),
    }


def _counters(urls: list[str]) -> list[dict[str, float]]:
    return [{k: v for k, v in cluster_counters(u).items() if k in ROUTING_COUNTERS} for u in urls]


def _delta(after: list[dict[str, float]], before: list[dict[str, float]]) -> dict[str, int]:
    return {
        k: int(sum(a.get(k, 0) - b.get(k, 0) for a, b in zip(after, before, strict=True)))
        for k in ROUTING_COUNTERS
    }


async def _phase(
    label: str, servers: list[Connected], prompts: list[Prompt], users: int, config: BenchConfig
) -> list[RequestRecord]:
    """A closed loop over both gateways, with `outpost bench`'s progress line."""
    progress = Progress()
    progress.start(label, len(prompts), None)
    try:
        return await closed_loop(
            servers, prompts, users, dict(config.extra_body), config.timeout, progress.update
        )
    finally:
        progress.finish()


async def _drive(ctx: Ctx, urls: list[str], workloads: dict[str, Workload], name: str) -> dict[str, Any]:
    """Build the prompts on the first call; warm up, then measure `name`'s workload."""
    users = ctx.args.prefix_streams
    config = _config(ctx, urls)
    async with AsyncExitStack() as stack:
        servers: list[Connected] = [await connect(t, config, stack) for t in config.targets]
        if not workloads:
            builder, _ = await prompt_builder(servers[0], config)
            log("(c): building prompts ...")
            workloads.update({w.name: w for w in await build_workloads(builder, ctx.args)})
        load = workloads[name]
        log(f"(c) {name}: warmup, {len(load.warm)} requests")
        await _phase(f"(c) {name} warmup", servers, load.warm, users, config)
        before = _counters(urls)
        log(f"(c) {name}: {len(load.measured)} requests at {users} streams over {len(urls)} gateways")
        records = await _phase(f"(c) {name}", servers, load.measured, users, config)
        after = _counters(urls)
    out = _summary(records, users)
    out["routing"] = _delta(after, before)
    out["routing_by_gateway"] = [_delta([a], [b]) for a, b in zip(after, before, strict=True)]
    out["samples"] = {
        "ttft_ms": [ms(r.ttft_s) for r in records if r.ok],
        "hit": [round((r.cache_n or 0) / r.prompt_tokens, 3) for r in records if r.ok and r.prompt_tokens],
    }
    return out


def _variant(
    ctx: Ctx, broker: Broker, routing: str, name: str, workloads: dict[str, Workload]
) -> dict[str, Any]:
    """Fresh workers and gateways with --prefix-routing `routing`; `name`'s workload through them."""
    log(f"== (c) {name} prefix, routing {routing}")
    with ExitStack() as stack:
        workers = [
            stack.enter_context(
                worker(broker, engine(ctx), ctx.worker_cpus(i), ctx.logs, f"c-{name}-{routing}-w{i}")
            )
            for i in range(2)
        ]
        urls = []
        for _ in range(2):
            url, _ = stack.enter_context(gateway(broker, ctx.model, ctx.logs, 1024, None, routing))
            urls.append(url)
        for url in urls:
            wait_workers(url, 2, workers)
        result = asyncio.run(_drive(ctx, urls, workloads, name))
        time.sleep(1.5)  # a heartbeat after the last request (they come every second)
        result["workers"] = [  # each worker's share, and what it holds (prefix_blocks x 64 tokens)
            {k: w.get(k) for k in ("id", "requests_done", "prefix_blocks", "prefill_tps")}
            for w in live_workers(urls[0])
        ]
    log(f"(c) {name} {routing}: " + str({k: v for k, v in result.items() if k != "samples"}))
    return result


def scenario_c(ctx: Ctx) -> dict[str, Any]:
    a = ctx.args
    workloads: dict[str, Workload] = {}
    out: dict[str, Any] = {
        "setup": {
            "workers": 2,
            "gateways": 2,
            "engine": " ".join(engine(ctx)[2:]),
            "worker_cpus": [ctx.worker_cpus(0), ctx.worker_cpus(1)],
            "streams": a.prefix_streams,
            "prefix_tokens": a.prefix_tokens,
            "turn_tokens": a.turn_tokens,
            "turn_max_tokens": a.turn_max_tokens,
            "requests": {"warmup": a.prefix_warmup, "measured": a.prefix_requests},
            "kv_sizing": "-kvu on, -c = 2.5 prefixes (2 prefixes + the running turns; never 3 prefixes); "
            "--cache-idle-cells = -c (idle prefixes stay until the pool needs the cells)",
        }
    }
    with running_broker(ctx.logs) as broker:
        for name in a.prefix_workloads.split(","):
            out[name] = {
                routing: _variant(ctx, broker, routing, name, workloads) for routing in ("on", "off")
            }
    out["targets"] = []
    if "shared" in out:
        on, off = out["shared"]["on"], out["shared"]["off"]
        out["ttft_p50_ratio"] = ratio(on["ttft_ms"]["p50"], off["ttft_ms"]["p50"])
        out["targets"] += [
            target("shared prefix, routing on: hit rate", on["hit_rate"], 0.9, False),
            target("shared prefix: TTFT p50 on / off", out["ttft_p50_ratio"], 0.5, True),
        ]
    if "distinct" in out:
        on, off = out["distinct"]["on"], out["distinct"]["off"]
        out["distinct_throughput_ratio"] = ratio(on["total_tok_s"], off["total_tok_s"])
        out["targets"].append(
            target("no shared prefix: throughput on / off", out["distinct_throughput_ratio"], 0.95, False)
        )
    return out
