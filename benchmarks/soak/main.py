"""Soak benchmark: a mixed load on `outpost serve` for a set time, then a pass/fail verdict.

Not a test. Run (it starts `outpost serve` itself on a free loopback port, a synthetic
SmolLM2-135M-shaped q4_0 model from benchmarks/harness/common.py, pinned with taskset when --cpus is given):

    python -m benchmarks.soak --duration 1200 --cpus 1 -t 1 -np 4 -c 4096 --max-queue 16
    python -m benchmarks.soak --url http://127.0.0.1:8080 --pid $(pgrep -f 'outpost serve') \
        --max-queue 64 --duration 600        # a running server (RSS from /proc/PID, or its /metrics)

`--concurrency` closed-loop users (default 8) each draw their next request from a weighted mix
(`--mix kind=weight,...`): streamed chat, non-streamed chat and completions, a long prompt whose
connection is closed before its first token (mid-prefill) or a stream closed after 1-24 tokens
(mid-decode), completions whose prompt + max_tokens is exactly the per-request context (from
/v1/models meta `n_ctx_seq`; must be served) or one token over (must be a 400
`context_length_exceeded`), embeddings, bad requests (malformed JSON, wrong types, unknown model:
any 4xx with an OpenAI error body), and overload bursts of slots + max_queue + `--burst-extra`
requests at once (429 with Retry-After expected and counted, never a 5xx). Before the timed mix,
one request of every kind, each at its largest size, primes the server; RSS "after warmup" is the
first sample after `--warmup` seconds and after that priming pass, and TTFT's first and last tenths
are tenths of the mixed load that follows it. Every request is bounded by `--timeout`, every
loop by a count and the clock.

Progress on stderr every `--progress-every` s (elapsed, requests by kind and outcome, RSS, busy
slots). At the end: a table on stderr, `results.json` and `soak.png` (TTFT and RSS over time,
requests by outcome) in `bench-results/soak-<timestamp>/` (or `--out`), the server's log there too
when started here, and a JSON summary as the last stdout line. Pass criteria (soak/report.py): no
5xx, no request lost, no slot busy after the load, RSS growth after warmup < 2%, no unexpected
answer, the server still running. Exit 0 when all pass, 1 when one fails, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.common import log
from benchmarks.soak.kinds import (
    KINDS,
    NEEDS_LIMIT,
    OUTCOMES,
    REJECTED,
    Ctx,
    PromptCounter,
    Result,
    StatusTally,
    run_burst,
    run_one,
)
from benchmarks.soak.report import Sample, SoakData, format_table, summarise, write_outputs
from benchmarks.soak.server import ServerProcess, Watch
from outpost.bench.client import first_model, make_client, probe
from outpost.bench.config import check_url
from outpost.bench.prompts import COMMON_WORDS, PromptBuilder
from outpost.bench.tokens import ServerTokenizer, detect, single_token_words

DEFAULT_MIX = (
    "stream_chat=30,chat=10,completion=10,cancel_prefill=6,cancel_decode=8,"
    "near_limit=2,over_limit=4,embeddings=8,bad_request=10,burst=1"
)
MAX_SAMPLES = 100_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--url", help="soak a running server instead of starting one")
    p.add_argument("--pid", type=int, help="--url's server pid, for its RSS (else its /metrics)")
    p.add_argument("--api-key")
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("-np", "--parallel", type=int, default=4)
    p.add_argument(
        "-c",
        "--ctx-size",
        type=int,
        default=4096,
        help="KV cells, all slots (a stream per slot: c / np per request)",
    )
    p.add_argument("-t", "--threads", type=int, help="default: the cores of --cpus, else all usable")
    p.add_argument("--max-queue", type=int, default=16, help="the server's (sizes the bursts)")
    p.add_argument("--cpus", help="pin the server with taskset -c CPUS (e.g. 1, or 2-5)")
    p.add_argument("--serve-arg", action="append", default=[], help="one more `outpost serve` argument")
    p.add_argument("--duration", type=float, default=1200.0, help="seconds of load")
    p.add_argument("--warmup", type=float, help="seconds before the RSS baseline (default 10%%, >= 30)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--seed", type=int, help="default: the clock")
    p.add_argument("--mix", default=DEFAULT_MIX, help="kind=weight,... (kinds: %(default)s)")
    p.add_argument("--burst-extra", type=int, default=8, help="burst = slots + max_queue + this")
    p.add_argument("--long-prompt", type=int, help="mid-prefill prompt tokens (default min(1024, ctx/2))")
    p.add_argument("--ctx-limit", type=int, help="per-request context when /v1/models does not say")
    p.add_argument("--timeout", type=float, default=180.0, help="client timeout per request (s)")
    p.add_argument("--sample-every", type=float, default=5.0, help="RSS and /health sampling (s)")
    p.add_argument("--progress-every", type=float, default=15.0)
    p.add_argument("--settle", type=float, default=60.0, help="wait for idle slots after the load (s)")
    p.add_argument("--out", type=Path, help="default bench-results/soak-<timestamp>")
    args = p.parse_args(argv)
    args.seed = int(time.time()) if args.seed is None else args.seed
    if args.warmup is None:
        args.warmup = min(args.duration / 2, max(30.0, args.duration / 10))
    if args.duration <= 0 or args.concurrency < 1 or args.timeout <= 0:
        p.error("--duration, --concurrency and --timeout must be positive")
    try:
        args.mix = parse_mix(args.mix)
    except ValueError as exc:
        p.error(str(exc))
    return args


def parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        kind, _, weight = item.partition("=")
        if kind not in (*KINDS, "burst"):
            raise ValueError(f"--mix: unknown kind {kind!r}; kinds: {', '.join([*KINDS, 'burst'])}")
        mix[kind] = float(weight)
    if not any(w > 0 for w in mix.values()):
        raise ValueError("--mix needs a positive weight")
    return {k: w for k, w in mix.items() if w > 0}


@dataclass
class Run:
    """The load's shared state: results so far, the samples, bursts, and the stop signal."""

    args: argparse.Namespace
    ctx: Ctx
    mix: dict[str, float]
    watch: Watch
    t0: float = field(default_factory=time.perf_counter)
    results: list[Result] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    bursts: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    burst_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    server_exit: int | None = None
    primed_s: float = 0.0  # when the priming pass ended

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def over(self) -> bool:
        return self.stop.is_set() or self.elapsed() >= self.args.duration

    async def one(self, kind: str, rng: random.Random) -> None:
        if kind != "burst":
            result = await run_one(kind, KINDS[kind], self.ctx, rng, self.t0)
            self.results.append(result)
            if result.outcome == REJECTED:  # as a client should: wait about Retry-After (1 s)
                await asyncio.sleep(rng.uniform(0.5, 1.5))
            return
        async with self.burst_lock:
            batch = await run_burst(self.ctx, rng, self.t0)
        self.results.extend(batch)
        self.bursts.append(sum(r.outcome == REJECTED for r in batch))


async def build_ctx(client: httpx.AsyncClient, args: argparse.Namespace) -> Ctx:
    """Probe the server: model, accepted fields, tokenizer, per-request context, slots."""
    model = await first_model(client)
    accepted = await probe(client, "chat", model, {})
    counter = await detect(client, model, frozenset(COMMON_WORDS))
    fill = await single_token_words(counter, list(COMMON_WORDS)) if counter.exact else list(COMMON_WORDS)
    exact = None
    if isinstance(counter, ServerTokenizer) and counter.shape == "llama.cpp":
        exact = PromptBuilder(PromptCounter(client, model, "llama.cpp"), fill, None)
    cards = (await client.get("/v1/models")).json()["data"]
    limit = next((c.get("meta", {}).get("n_ctx_seq") for c in cards if c["id"] == model), None)
    limit = limit or args.ctx_limit
    health = (await client.get("/health")).json()
    long_prompt = args.long_prompt or min(1024, (limit or 2048) // 2)
    slots = int(health.get("slots_total") or args.parallel)
    return Ctx(
        client=client,
        model=model,
        accepted=accepted,
        fill=fill,
        exact=exact,
        limit=limit,
        slots=slots,
        max_queue=args.max_queue,
        burst_extra=args.burst_extra,
        timeout=args.timeout,
        long_prompt=long_prompt,
    )


async def worker(run: Run, index: int) -> None:
    kinds, weights = list(run.mix), list(run.mix.values())
    rng = random.Random(f"{run.args.seed}:worker:{index}")
    for n in range(int(run.args.duration * 100) + 100):  # far more than a user can send
        if run.over():
            return
        kind = rng.choices(kinds, weights)[0]
        if kind == "burst" and run.burst_lock.locked():
            kind = "stream_chat"  # one burst at a time
        await run.one(kind, random.Random(f"{run.args.seed}:{index}:{n}"))


async def prime(run: Run) -> None:
    """One request of every kind first, each at its largest size, so the RSS baseline has seen
    every path: embeddings load their own context on first use, and llama.cpp's compute buffers
    become resident page by page as larger batches and deeper attention touch them."""
    run.ctx.priming = True
    try:
        for i, kind in enumerate(run.mix):
            if not run.over():
                await run.one(kind, random.Random(f"{run.args.seed}:prime:{i}"))
    finally:
        run.ctx.priming = False
    run.primed_s = run.elapsed()
    log(f"primed: one request of each kind, at its largest, in {run.primed_s:.1f} s")


async def monitor(run: Run) -> None:
    next_line = run.args.progress_every
    for _ in range(MAX_SAMPLES):
        sample = await run.watch.sample(run.elapsed())
        run.samples.append(sample)
        run.server_exit = run.watch.exited()
        if run.server_exit is not None:
            log(f"the server exited with {run.server_exit}: stopping the load")
            run.stop.set()
        if sample.t_s >= next_line:
            log(progress_line(run, sample))
            next_line += run.args.progress_every
        try:
            await asyncio.wait_for(run.stop.wait(), run.args.sample_every)
            return
        except TimeoutError:
            pass


def progress_line(run: Run, s: Sample) -> str:
    by_kind: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    for r in list(run.results):
        by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
        by_outcome[r.outcome] = by_outcome.get(r.outcome, 0) + 1
    kinds = " ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    outcomes = " ".join(f"{o} {by_outcome[o]}" for o in OUTCOMES if o in by_outcome)
    rss = f"{s.rss_bytes / 2**20:.1f} MiB" if s.rss_bytes else "?"
    return (
        f"[{s.t_s:6.0f}/{run.args.duration:g} s] {len(run.results)} requests | {outcomes} | {kinds} "
        f"| RSS {rss} | busy {s.slots_busy}/{run.ctx.slots} queue {s.queue_depth}"
    )


async def load(run: Run) -> float:
    """Prime, then the users until --duration; returns when the last request ended."""
    await prime(run)
    users = [worker(run, i) for i in range(run.args.concurrency)]
    bound = run.args.duration + 2 * run.args.timeout + 60  # every request is bounded by the timeout
    try:
        await asyncio.wait_for(asyncio.gather(*users), bound)
    except TimeoutError:
        log(f"the load did not end within {bound:g} s: cancelled")
    return run.elapsed()


def effective_mix(mix: dict[str, float], ctx: Ctx) -> dict[str, float]:
    if ctx.exact is None or ctx.limit is None:
        log(f"no exact token counts or per-request context: {', '.join(NEEDS_LIMIT)} left out of the mix")
        return {k: w for k, w in mix.items() if k not in NEEDS_LIMIT}
    return mix


async def soak(args: argparse.Namespace, url: str, pid: int | None, proc: Any) -> SoakData:
    tally = StatusTally()
    async with (
        make_client(url, args.api_key, args.timeout, None) as client,
        make_client(url, args.api_key, 10.0, 4) as side,
    ):
        ctx = await build_ctx(client, args)
        client.event_hooks = {"response": [tally]}  # after the probes: their 4xx are not the load's
        mix = effective_mix(args.mix, ctx)
        log(f"model {ctx.model}, {ctx.slots} slots, context {ctx.limit} per request, mix {mix}")
        watch = Watch(side, pid, proc)
        rss_start = await watch.rss()
        run = Run(args, ctx, mix, watch)
        sampler = asyncio.create_task(monitor(run))
        duration = await load(run)
        run.stop.set()
        await sampler
        settle = await watch.settle(args.settle)
        rss_end = await watch.rss_settled()
        run.server_exit = watch.exited()
    warmup = max(args.warmup, run.primed_s)
    warm = next((s.rss_bytes for s in run.samples if s.t_s >= warmup and s.rss_bytes), None)
    if warm is None:
        log(f"no RSS sample after the warmup ({warmup:.0f} s): a longer --duration, or --pid with --url")
    found = {"url": url, "model": ctx.model, "ctx_limit": ctx.limit, "slots": ctx.slots}
    config = {k: v for k, v in vars(args).items() if k != "out"} | found
    config |= {"mix": mix, "accepted": asdict(ctx.accepted), "long_prompt": ctx.long_prompt}
    return SoakData(
        config=config,
        planned_s=args.duration,
        primed_s=min(run.primed_s, args.duration),
        duration_s=duration,
        warmup_s=warmup,
        results=run.results,
        samples=run.samples,
        rss_start=rss_start,
        rss_warm=warm,
        rss_end=rss_end,
        settle=settle,
        tally=tally,
        bursts=run.bursts,
        server_exit=run.server_exit,
    )


def main() -> int:
    args = parse_args()
    out = args.out or Path("bench-results") / time.strftime("soak-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    if args.url:
        data = asyncio.run(soak(args, check_url(args.url), args.pid, None))
    else:
        with ServerProcess(args, out / "server.log") as server:
            data = asyncio.run(soak(args, server.url, server.proc.pid, server.proc))
    summary = summarise(data, out)
    write_outputs(out, data, summary)
    log("\n" + format_table(summary))
    log(f"\nresults in {out}")
    print(json.dumps(summary))
    return 0 if summary["pass"] else 1
