"""benchmarks/cluster/'s scenarios (a), (b) and (e): the gateway's overhead, scaling to a second
worker, and a burst at a bounded queue. Each starts its own broker and processes and stops them."""

from __future__ import annotations

import statistics
from contextlib import ExitStack
from typing import Any

from benchmarks.cluster.common import Ctx, bench, ms, ratio, run_of, target
from benchmarks.cluster.floor import broker_floor
from benchmarks.cluster.paired import paired_one_stream
from benchmarks.harness.common import log
from benchmarks.harness.procs import (
    cpu_set,
    engine_args,
    gateway,
    pinned,
    running_broker,
    serve,
    wait_workers,
    worker,
)
from outpost.bench.records import RequestRecord, RunSummary, Stats
from outpost.bench.stats import stats

A_SLOTS = 8
A_LEVELS = (1, 8)
SERVE, GATEWAY, CONTROL = "serve", "gateway", "serve B"


def _ttfts(records: list[RequestRecord]) -> list[float]:
    return [round(r.ttft_s * 1000.0, 2) for r in records if r.ok and r.ttft_s is not None]


def _level_a(direct: list[RunSummary], via: list[RunSummary], pooled: tuple[Stats, Stats]) -> dict[str, Any]:
    """One level over every round: TTFT percentiles of the pooled requests, tok/s the rounds' median."""
    d, v = pooled
    direct_tps = statistics.median(r.output_tok_s for r in direct)
    via_tps = statistics.median(r.output_tok_s for r in via)
    return {
        "serve_ttft_ms": {"p50": ms(d.p50), "p99": ms(d.p99)},
        "gateway_ttft_ms": {"p50": ms(v.p50), "p99": ms(v.p99)},
        "added_ttft_ms": {"p50": ms((v.p50 or 0) - (d.p50 or 0)), "p99": ms((v.p99 or 0) - (d.p99 or 0))},
        "serve_output_tok_s": round(direct_tps, 2),
        "gateway_output_tok_s": round(via_tps, 2),
        "rounds_output_tok_s": {
            "serve": [round(r.output_tok_s, 2) for r in direct],
            "gateway": [round(r.output_tok_s, 2) for r in via],
        },
        "throughput_ratio": ratio(via_tps, direct_tps),
        "errors": {"serve": sum(r.errors for r in direct), "gateway": sum(r.errors for r in via)},
    }


def _rounds_a(
    ctx: Ctx, urls: dict[str, str]
) -> dict[tuple[str, int], list[tuple[RunSummary, list[RequestRecord]]]]:
    """--a-rounds rounds; each runs both levels on serve and on the gateway, the order swapped every
    round, so a drift of the machine's speed during the run falls on both alike."""
    args = ctx.args
    levels = ",".join(str(v) for v in A_LEVELS)
    runs: dict[tuple[str, int], list[tuple[RunSummary, list[RequestRecord]]]] = {}
    for n in range(args.a_rounds):
        order = list(urls) if n % 2 == 0 else list(reversed(urls))
        log(f"(a) round {n + 1} of {args.a_rounds}: {' then '.join(order)}")
        result = bench(
            ctx,
            {label: urls[label] for label in order},
            levels,
            args.a_requests,
            args.warmup,
            args.a_output_std,
            args.a_ramp_up,
        )
        for label in urls:
            for level in A_LEVELS:
                runs.setdefault((label, level), []).append(run_of(result, label, level))
    return runs


def scenario_a(ctx: Ctx) -> dict[str, Any]:
    """`outpost serve` vs gateway + broker + one worker: the same engine flags on the same CPUs
    (--engine-cpus, -t = their count); broker, gateway and load generator on --infra-cpus. With
    --a-control, a second `outpost serve` runs as a third arm: serve vs serve shows how far two
    identical servers differ in this run, the resolution the gateway's figures are read at."""
    args = ctx.args
    threads = len(cpu_set(args.engine_cpus)) if args.engine_cpus else args.threads
    engine = engine_args(ctx.model, threads, A_SLOTS)
    with ExitStack() as stack:
        stack.enter_context(pinned(args.infra_cpus))
        broker = stack.enter_context(running_broker(ctx.logs, args.infra_cpus))
        floor = broker_floor(broker)
        log(f"(a) the broker's two hops alone (aio-pika, from the infra CPUs): {floor['both']} ms")
        urls: dict[str, str] = {}
        for label in (SERVE, CONTROL) if args.a_control else (SERVE,):
            proc, urls[label] = serve(ctx.model, engine, args.engine_cpus, ctx.logs)
            stack.enter_context(proc)
        w = stack.enter_context(worker(broker, engine, args.engine_cpus, ctx.logs, "a-w0"))
        urls[GATEWAY], _ = stack.enter_context(gateway(broker, ctx.model, ctx.logs, 1024, args.infra_cpus))
        wait_workers(urls[GATEWAY], 1, [w])
        runs = _rounds_a(ctx, urls)
        paired = paired_one_stream(ctx, urls[SERVE], urls[GATEWAY]) if args.a_paired else None
    out: dict[str, Any] = {"setup": _setup_a(args, engine), "broker_floor_ms": floor, "samples_ttft_ms": {}}
    out["targets"] = []
    if paired:
        out["paired_1_stream"] = paired
        added = paired.get("added_ttft_ms", {}).get("p50")
        out["targets"].append(target("1 stream, paired: added TTFT p50 (ms)", added, 2, True))
    for level in A_LEVELS:
        row = _compare_a(runs, SERVE, GATEWAY, level)
        if args.a_control:
            row["control"] = _compare_a(runs, SERVE, CONTROL, level)
        out[f"streams_{level}"] = row
        out["samples_ttft_ms"][str(level)] = {
            label: _ttfts([rec for _, recs in runs[(label, level)] for rec in recs]) for label in urls
        }
        out["targets"] += [
            target(f"{level} streams: added TTFT p50 (ms)", row["added_ttft_ms"]["p50"], 2, True),
            target(f"{level} streams: added TTFT p99 (ms)", row["added_ttft_ms"]["p99"], 10, True),
            target(f"{level} streams: throughput ratio", row["throughput_ratio"], 0.95, False),
        ]
    return out


def _compare_a(
    runs: dict[tuple[str, int], list[tuple[RunSummary, list[RequestRecord]]]],
    base: str,
    other: str,
    level: int,
) -> dict[str, Any]:
    """`other` against `base` at one level: the pooled TTFT percentiles, the rounds' median tok/s."""
    direct = [rec for _, recs in runs[(base, level)] for rec in recs]
    via = [rec for _, recs in runs[(other, level)] for rec in recs]
    pooled = (_ttft_stats(direct), _ttft_stats(via))
    return _level_a([s for s, _ in runs[(base, level)]], [s for s, _ in runs[(other, level)]], pooled)


def _setup_a(args: Any, engine: list[str]) -> dict[str, Any]:
    return {
        "engine": " ".join(engine[2:]),
        "engine_cpus": args.engine_cpus,
        "infra_cpus": args.infra_cpus,
        "rounds": args.a_rounds,
        "requests": args.a_requests,
        "output_tokens": f"{args.max_tokens} +- {args.a_output_std:g}",
        "ramp_up_s": args.a_ramp_up,
        "control": args.a_control,
        "note": "serve and the worker (and the control, a second serve): the same engine flags on the "
        "same CPUs, started together (an idle one costs nothing); each round runs both levels on every "
        "arm, the order reversed every round, the same prompts and output lengths for all; the users "
        "start over the ramp-up and their outputs differ in length, so their requests do not stay in "
        "step; TTFT percentiles pool every round's requests, tok/s is the median of the rounds; "
        "'control' is serve against the second serve (serve_* is the first, gateway_* the second)",
    }


def _ttft_stats(records: list[RequestRecord]) -> Stats:
    return stats([r.ttft_s for r in records if r.ok])


def scenario_b(ctx: Ctx) -> dict[str, Any]:
    """One worker (-t 1, pinned to --worker-cpus' first CPU), then a second on the next; 8 streams
    per worker. The broker, the gateway and the load generator are not pinned: they share the CPUs."""
    args = ctx.args
    engine = engine_args(ctx.model, 1, 8)
    with ExitStack() as stack:
        broker = stack.enter_context(running_broker(ctx.logs))
        w1 = stack.enter_context(worker(broker, engine, ctx.worker_cpus(0), ctx.logs, "b-w0"))
        gw, _ = stack.enter_context(gateway(broker, ctx.model, ctx.logs, 1024))
        wait_workers(gw, 1, [w1])
        one, _ = run_of(bench(ctx, {"1 worker": gw}, "8", args.requests, args.warmup), "1 worker", 8)
        w2 = stack.enter_context(worker(broker, engine, ctx.worker_cpus(1), ctx.logs, "b-w1"))
        wait_workers(gw, 2, [w1, w2])
        result = bench(ctx, {"2 workers": gw}, "16", 2 * args.requests, args.warmup)
        two, _ = run_of(result, "2 workers", 16)
    scale = ratio(two.output_tok_s, one.output_tok_s)
    return {
        "one_worker_output_tok_s": round(one.output_tok_s, 2),
        "two_workers_output_tok_s": round(two.output_tok_s, 2),
        "ratio": scale,
        "ttft_s_p50": {"one": one.ttft_s.p50, "two": two.ttft_s.p50},
        "errors": {"one": one.errors, "two": two.errors},
        "worker_cpus": [ctx.worker_cpus(0), ctx.worker_cpus(1)],
        "note": "each worker -t 1 on its own core (taskset); the broker, the gateway and the load "
        "generator are not pinned and share the cores with them",
        "targets": [target("2 vs 1 workers: aggregate tok/s ratio", scale, 1.6, False)],
    }


def scenario_e(ctx: Ctx) -> dict[str, Any]:
    """A burst of --burst requests sent at once at 2 workers x 4 slots behind a queue of 256."""
    args = ctx.args
    engine = engine_args(ctx.model, 1, 4)
    with ExitStack() as stack:
        broker = stack.enter_context(running_broker(ctx.logs))
        workers = [
            stack.enter_context(worker(broker, engine, ctx.worker_cpus(i), ctx.logs, f"e-w{i}"))
            for i in range(2)
        ]
        gw, _ = stack.enter_context(gateway(broker, ctx.model, ctx.logs, 256))
        wait_workers(gw, 2, workers)
        log(f"(e): {args.burst} requests at once")
        result = bench(ctx, {"burst": gw}, str(args.burst), args.burst, 0)
        run, _ = run_of(result, "burst", args.burst)
    rejected = sum(n for code, n in run.errors_by_code.items() if code in ("429", "503"))
    return {
        "requests": args.burst,
        "answered_ok": run.requests_ok,
        "rejected": rejected,
        "errors": run.errors,
        "errors_by_code": run.errors_by_code,
        "duration_s": round(run.duration_s, 2),
        "ttft_s": run.ttft_s.as_dict(),
        "targets": [
            target("burst: answered", run.requests_ok, args.burst, False),
            target("burst: rejected", rejected, 0, True),
        ],
    }
