"""Running a benchmark: probe every server, prepare prompts, then for each level run a warmup and a
measured phase on every server in turn (A B A B ...), and summarise each.

`run_bench(config)` is the API (`outpost bench` calls it); it returns a `BenchResult` and writes
nothing: `report` and `plots` turn the result into files and tables. Its steps are public for callers
that order the work themselves (`benchmarks/serve/`: rounds, cold starts): `connect` a server,
`prompt_builder` from one, `run_level` on one.
"""

from __future__ import annotations

import asyncio
import random
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx

from outpost.bench.client import PATHS, first_model, make_client, probe, request_body, send
from outpost.bench.config import BenchConfig, BenchUsageError, ServerTarget
from outpost.bench.loadgen import Phase, SendFn, arrival_rng, run_phase
from outpost.bench.progress import Progress
from outpost.bench.prompts import COMMON_WORDS, Prompt, PromptBuilder, build_prompts
from outpost.bench.records import Accepted, BenchResult, PromptStats, RequestRecord, RunResult, ServerInfo
from outpost.bench.stats import summarise
from outpost.bench.tokens import detect, single_token_words


@dataclass
class Connected:
    """A server probed (or described) and the client that talks to it."""

    info: ServerInfo
    client: httpx.AsyncClient


async def run_bench(config: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """Run `config` and return every level's result for every server."""
    progress = progress or Progress()
    async with AsyncExitStack() as stack:
        servers = [await connect(target, config, stack) for target in config.targets]
        builder, prompt_stats = await prompt_builder(servers[0], config)
        progress.log(f"prompts: {prompt_stats.note}")
        result = BenchResult([s.info for s in servers], prompt_stats)
        for li, level in enumerate(config.plan.levels):
            seed = f"{config.seed}:{config.scenario.name}:{li}"
            measured = await build_prompts(builder, config.scenario, seed, config.plan.cap(level))
            warm = await build_prompts(builder, config.scenario, seed + ":warmup", config.plan.warmup)
            for server in servers:  # each level on every server in turn: drift hits all alike
                result.runs.append(await run_level(server, config, li, level, measured, warm, progress))
    return result


def _client(target: ServerTarget, config: BenchConfig) -> httpx.AsyncClient:
    plan = config.plan
    # Closed loop never has more than `level` requests in flight; open loop has no bound but the
    # prompt count, and a pool limit would queue requests inside the client and fake latency.
    connections = int(max(plan.levels)) + 4 if plan.mode == "concurrency" else None
    return make_client(target.url, config.api_key, config.timeout, connections)


async def connect(
    target: ServerTarget, config: BenchConfig, stack: AsyncExitStack, accepted: Accepted | None = None
) -> Connected:
    """A client for `target` (closed with `stack`), probed for the extension fields it accepts unless
    `accepted` is given: then no completion request is sent (a cold server stays cold)."""
    client = await stack.enter_async_context(_client(target, config))
    model = target.model or await first_model(client)
    if accepted is None:
        accepted = await probe(client, config.endpoint, model, dict(config.extra_body))
    return Connected(ServerInfo(target.label, target.url, model, accepted), client)


async def prompt_builder(server: Connected, config: BenchConfig) -> tuple[PromptBuilder, PromptStats]:
    """Prompts sized by `server`'s /tokenize when it has one, else by a stated estimate."""
    counter = await detect(server.client, server.info.model, frozenset(COMMON_WORDS))
    corpus = read_corpus(config.prompt_file) if config.prompt_file else None
    if counter.exact:
        words = await single_token_words(counter, list(COMMON_WORDS))
        note = f"token counts exact, by {server.info.label}/tokenize ({len(words)} one-token filler words)"
    else:
        words = list(COMMON_WORDS)
        note = (
            f"{server.info.label} has no /tokenize: token counts are an ESTIMATE (1 per common word, "
            "1 per 4 characters otherwise); the server's own counts are in requests.csv (prompt_tokens)"
        )
    return PromptBuilder(counter, words, corpus), PromptStats(counter.method, counter.exact, note)


def read_corpus(path: Path) -> list[str]:
    try:
        words = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError as exc:
        raise BenchUsageError(f"cannot read --prompt-file {path}: {exc.strerror}") from None
    if not words:
        raise BenchUsageError(f"--prompt-file {path} has no text")
    return words


def _sender(server: Connected, config: BenchConfig) -> SendFn:
    path = PATHS[config.endpoint]
    info = server.info

    async def send_one(prompt: Prompt, now: float) -> RequestRecord:
        body = request_body(
            config.endpoint, info.model, prompt.system, prompt.text, prompt.max_tokens, info.accepted
        )
        record = RequestRecord(prompt.index, now, prompt.input_tokens, prompt.max_tokens)
        return await send(server.client, path, {**body, **config.extra_body}, record, config.timeout)

    return send_one


async def run_level(
    server: Connected,
    config: BenchConfig,
    li: int,
    level: float,
    measured: list[Prompt],
    warm: list[Prompt],
    progress: Progress,
) -> RunResult:
    """`warm` (results dropped), then `measured` on one server at `level`, the `li`-th level."""
    plan, info = config.plan, server.info
    name = f"{info.label} {'c' if plan.mode == 'concurrency' else 'rate'}={level:g}"
    send_one = _sender(server, config)
    if warm:  # same load shape, results dropped: fills caches, pools and JITs before measuring
        progress.log(f"{name}: warmup, {len(warm)} requests")
        warm_phase = Phase(plan.mode, level, warm, None, plan.ramp_up)
        await run_phase(warm_phase, send_one, random.Random(f"{config.seed}:{li}:warm"), lambda r: None)
    progress.start(name, len(measured), plan.duration)
    phase = Phase(plan.mode, level, measured, plan.duration, plan.ramp_up)
    outcome = await run_phase(phase, send_one, arrival_rng(config.seed, li), progress.update)
    progress.finish()
    summary = summarise(
        outcome.records,
        label=info.label,
        url=info.url,
        model=info.model,
        mode=plan.mode,
        level=level,
        capped=outcome.capped,
    )
    return RunResult(summary, outcome.records)


def run_bench_sync(config: BenchConfig, progress: Progress | None = None) -> BenchResult:
    """`run_bench` from synchronous code (the CLI, scripts)."""
    return asyncio.run(run_bench(config, progress))
