"""What benchmarks/cluster/'s scenarios share: the run context, the `outpost bench` workload, a
closed loop over several gateways, and small helpers for numbers and targets."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness.common import log
from outpost.bench.client import PATHS, request_body, send
from outpost.bench.config import BenchConfig, ServerTarget, make_plan, make_scenario
from outpost.bench.progress import Progress
from outpost.bench.prompts import Prompt
from outpost.bench.records import BenchResult, RequestRecord, RunSummary
from outpost.bench.report import format_tables
from outpost.bench.runner import Connected, run_bench_sync
from outpost.bench.stats import percentile


@dataclass
class Ctx:
    """One benchmark run: its flags, model, banned end-of-generation ids and output folder."""

    args: argparse.Namespace
    model: Path
    eog: list[int]
    out: Path

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    def worker_cpus(self, i: int) -> str | None:
        """Worker i's CPU (`--worker-cpus`, round robin); None: not pinned."""
        cpus = [c for c in (self.args.worker_cpus or "").split(",") if c.strip()]
        return cpus[i % len(cpus)] if cpus else None

    def ban_eog(self) -> dict[str, Any]:
        """Every end-of-generation token banned: each stream runs to max_tokens."""
        return {"logit_bias": {str(t): -100 for t in self.eog}}


def bench(
    ctx: Ctx,
    targets: dict[str, str],
    levels: str,
    requests: int,
    warmup: int,
    output_std: float = 0.0,
    ramp_up: float = 0.0,
) -> BenchResult:
    """`outpost bench`'s chat workload (distinct prompts of --input-tokens, streamed outputs of
    --max-tokens, +- `output_std`) at each of `levels` on every target in turn, the same prompts for
    each; closed-loop users start over `ramp_up` seconds."""
    config = chat_config(ctx, targets, levels, requests, warmup, output_std, ramp_up)
    result = run_bench_sync(config, Progress())
    log("\n" + format_tables(result))
    return result


def chat_config(
    ctx: Ctx,
    targets: dict[str, str],
    levels: str,
    requests: int,
    warmup: int,
    output_std: float = 0.0,
    ramp_up: float = 0.0,
) -> BenchConfig:
    """The chat workload's config: prompts of --input-tokens, outputs of --max-tokens +- `output_std`."""
    args = ctx.args
    return BenchConfig(
        targets=tuple(ServerTarget(url=url, label=label) for label, url in targets.items()),
        plan=make_plan(levels, None, requests, None, warmup, ramp_up),
        scenario=make_scenario("custom", str(args.input_tokens), f"{args.max_tokens},{output_std:g}"),
        seed=int(time.time()),  # distinct prompts every run: no prefix cache hits across runs
        timeout=args.timeout,
        extra_body={"temperature": 0.8, **ctx.ban_eog()},
    )


def run_of(result: BenchResult, label: str, level: int) -> tuple[RunSummary, list[RequestRecord]]:
    run = next(r for r in result.runs if r.summary.label == label and int(r.summary.level) == level)
    return run.summary, run.records


async def closed_loop(
    servers: Sequence[Connected],
    prompts: Sequence[Prompt],
    users: int,
    extra: dict[str, Any],
    timeout: float,
    on_record: Callable[[RequestRecord], None] = lambda r: None,
) -> list[RequestRecord]:
    """`users` closed-loop users, user u on servers[u % len]: the load split across gateways.
    Each user sends the next unsent prompt when its last request ends; one request per prompt."""
    queue = iter(prompts)
    records: list[RequestRecord] = []
    t0 = time.perf_counter()

    async def user(u: int) -> None:
        server = servers[u % len(servers)]
        info = server.info
        for prompt in queue:
            body = request_body(
                "chat", info.model, prompt.system, prompt.text, prompt.max_tokens, info.accepted
            )
            record = RequestRecord(
                prompt.index, time.perf_counter() - t0, prompt.input_tokens, prompt.max_tokens
            )
            records.append(await send(server.client, PATHS["chat"], {**body, **extra}, record, timeout))
            on_record(record)

    await asyncio.gather(*(user(u) for u in range(users)))
    return sorted(records, key=lambda r: r.index)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, None for no values."""
    ordered = sorted(values)
    return percentile(ordered, q) if ordered else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def target(name: str, value: float | None, limit: float, at_most: bool) -> dict[str, Any]:
    """One of the issue's targets: `value` <= limit (at_most) or >= limit."""
    met = None if value is None else (value <= limit if at_most else value >= limit)
    return {"name": name, "value": value, "target": f"{'<=' if at_most else '>='} {limit:g}", "met": met}
