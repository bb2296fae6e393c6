"""benchmarks/serve/'s two workloads, driven through `outpost bench`'s runner steps (connect,
prompt_builder, run_level): the throughput rounds against servers that stay up, and the
shared-prefix scenario on freshly started servers (cold, then warm).

Run through serve.py:  python -m benchmarks.serve [--scenarios throughput,shared-prefix] ...
"""

from __future__ import annotations

import argparse
import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from benchmarks.harness.common import log
from benchmarks.harness.servers import LABELS, ServerProcess, Setup
from benchmarks.serve.report import FIRST_WAVE, LevelRun, PrefixRun, Report
from outpost.bench.config import BenchConfig, ServerTarget, make_plan, make_scenario
from outpost.bench.progress import Progress
from outpost.bench.prompts import Prompt, build_prompts
from outpost.bench.records import Accepted, RunResult
from outpost.bench.runner import connect, prompt_builder, run_level
from outpost.bench.stats import summarise


def rotate(items: list[str], by: int) -> list[str]:
    """`items` starting at `by` (mod its length): round r's order, so each server leads in turn."""
    k = by % len(items) if items else 0
    return items[k:] + items[:k]


def requests_at(args: argparse.Namespace, streams: int) -> tuple[int, int]:
    """(measured, warmup) requests at a level: by default 4 per stream (at least 16), one warmup
    request per stream (at least 4)."""
    measured = args.requests or max(16, 4 * streams)
    warmup = args.warmup if args.warmup is not None else max(4, streams)
    return measured, warmup


def base_config(
    targets: list[ServerTarget],
    levels: list[int],
    scenario: str,
    args: argparse.Namespace,
    extra: dict[str, Any],
) -> BenchConfig:
    """Closed loop at `levels`; a level starts no request after --level-time seconds."""
    tokens = (str(args.input_tokens), str(args.max_tokens)) if scenario == "custom" else (None, None)
    return BenchConfig(
        targets=tuple(targets),
        plan=make_plan(",".join(map(str, levels)), None, None, args.level_time, 0),
        scenario=make_scenario(scenario, *tokens),
        seed=args.seed,
        timeout=args.timeout,
        extra_body=extra,
    )


def check_alive(proc: ServerProcess) -> bool:
    code = proc.exited()
    if code is not None:
        log(f"[{proc.spec.label}] EXITED with {code} mid-run; left out from now on. Its log's tail:")
        log(proc.log_tail())
    return code is None


def _runs_at(kind: str, level: int, args: argparse.Namespace) -> bool:
    return kind != "llama_cpp_python" or level in args.llama_cpp_python_levels


async def throughput_rounds(
    procs: dict[str, ServerProcess], args: argparse.Namespace, extra: dict[str, Any]
) -> tuple[list[LevelRun], str]:
    """Every round, every level, every server that runs at it in the round's rotated order; the
    same prompts for all servers of a (round, level), different ones for every other."""
    targets = [ServerTarget(p.url, LABELS[k]) for k, p in procs.items()]
    config = base_config(targets, args.levels, "custom" if args.lengths == "fixed" else "chat", args, extra)
    runs: list[LevelRun] = []
    async with AsyncExitStack() as stack:
        conns = {k: await connect(t, config, stack) for k, t in zip(procs, targets, strict=True)}
        builder, stats = await prompt_builder(next(iter(conns.values())), config)
        log(f"prompts: {stats.note}")
        for r in range(args.rounds):
            for li, level in enumerate(args.levels):
                seed = f"{args.seed}:throughput:r{r}:c{level}"
                n, w = requests_at(args, level)
                measured = await build_prompts(builder, config.scenario, seed, n)
                warm = await build_prompts(builder, config.scenario, seed + ":warmup", w)
                up = [k for k in conns if _runs_at(k, level, args) and procs[k].exited() is None]
                order = rotate(up, r)
                log(f"\nround {r + 1}/{args.rounds}, {level} streams: {', '.join(LABELS[k] for k in order)}")
                for pos, kind in enumerate(order):
                    run = await run_level(conns[kind], config, li, level, measured, warm, Progress())
                    runs.append(LevelRun(LABELS[kind], level, r, pos, run))
                    check_alive(procs[kind])
    return runs, stats.note


@dataclass(frozen=True)
class PrefixPrompts:
    """One round's prompts, all with the same system prompt: the cold ones, the warmup, the warm ones."""

    cold: list[Prompt]
    warmup: list[Prompt]
    warm: list[Prompt]


def _prefix_config(
    proc: ServerProcess, kind: str, args: argparse.Namespace, extra: dict[str, Any]
) -> BenchConfig:
    body = {**extra, "cache_prompt": True} if kind == "llama_server" else extra  # its users' request field
    return base_config(
        [ServerTarget(proc.url, LABELS[kind])], [args.prefix_streams], "shared-prefix", args, body
    )


async def _probe_and_build(
    proc: ServerProcess, kind: str, args: argparse.Namespace, extra: dict[str, Any], build: bool
) -> tuple[Accepted, list[PrefixPrompts], str]:
    config = _prefix_config(proc, kind, args, extra)
    async with AsyncExitStack() as stack:
        conn = await connect(config.targets[0], config, stack)
        if not build:
            return conn.info.accepted, [], ""
        builder, stats = await prompt_builder(conn, config)
        n, w = args.prefix_requests, args.prefix_warmup
        rounds = []
        for r in range(args.rounds):
            p = await build_prompts(builder, config.scenario, f"{args.seed}:shared-prefix:r{r}", 2 * n + w)
            rounds.append(PrefixPrompts(p[:n], p[n : n + w], p[n + w :]))
    return conn.info.accepted, rounds, stats.note


def prepare_prefix(
    kinds: list[str], setup: Setup, args: argparse.Namespace, extra: dict[str, Any]
) -> tuple[dict[str, Accepted], list[PrefixPrompts], str]:
    """A throwaway instance of each server, probed for the body fields it accepts, so the fresh
    ones get no request before their measured ones; the first one's /tokenize builds all prompts."""
    accepted: dict[str, Accepted] = {}
    prompts: list[PrefixPrompts] = []
    note = ""
    for kind in kinds:
        log_path = args.out / "logs" / f"{LABELS[kind]}-prefix-probe.log"
        with ServerProcess.start(kind, setup, log_path, prompt_cache=True) as proc:
            build = kind == kinds[0]
            accepted[kind], built, text = asyncio.run(_probe_and_build(proc, kind, args, extra, build))
            prompts, note = (built, text) if build else (prompts, note)
    return accepted, prompts, note


async def _cold_then_warm(
    proc: ServerProcess,
    kind: str,
    accepted: Accepted,
    prompts: PrefixPrompts,
    args: argparse.Namespace,
    extra: dict[str, Any],
) -> list[tuple[str, RunResult]]:
    config = _prefix_config(proc, kind, args, extra)
    level = args.prefix_streams
    async with AsyncExitStack() as stack:
        conn = await connect(config.targets[0], config, stack, accepted)  # no probe: it stays cold
        cold = await run_level(conn, config, 0, level, prompts.cold, [], Progress())
        warm = await run_level(conn, config, 0, level, prompts.warm, prompts.warmup, Progress())
    return [(FIRST_WAVE, first_wave(cold, level)), ("cold", cold), ("warm", warm)]


def first_wave(cold: RunResult, streams: int) -> RunResult:
    """The cold run's first request of each stream: the ones that reach the server while nothing is
    cached (each closed-loop user takes the next prompt, so they are prompts 0 .. streams-1). The
    cold run's later requests arrive once the first answers are out, to a warm cache on any server."""
    records = [r for r in cold.records if r.index < streams]
    s = cold.summary
    summary = summarise(
        records, label=s.label, url=s.url, model=s.model, mode=s.mode, level=s.level, capped=False
    )
    return RunResult(summary, records)


def run_shared_prefix(
    kinds: list[str], setup: Setup, args: argparse.Namespace, extra: dict[str, Any], report: Report
) -> None:
    """Every round, every server in the round's rotated order, each freshly started (one at a time)."""
    if not kinds:
        return
    log(f"\nshared-prefix: {args.prefix_streams} streams, {', '.join(LABELS[k] for k in kinds)}")
    accepted, rounds, note = prepare_prefix(kinds, setup, args, extra)
    report.notes.append(f"shared-prefix prompts: {note}")
    for r, prompts in enumerate(rounds):
        for pos, kind in enumerate(rotate(kinds, r)):
            log(f"\nshared-prefix round {r + 1}/{args.rounds}: {LABELS[kind]}, freshly started")
            log_path = args.out / "logs" / f"{LABELS[kind]}-prefix-r{r + 1}.log"
            with ServerProcess.start(kind, setup, log_path, prompt_cache=True) as proc:
                report.prefix_servers[LABELS[kind]] = proc.spec.describe()
                phases = asyncio.run(_cold_then_warm(proc, kind, accepted[kind], prompts, args, extra))
                check_alive(proc)
            report.prefix_runs += [PrefixRun(LABELS[kind], r, pos, phase, run) for phase, run in phases]
