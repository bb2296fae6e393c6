"""benchmarks/cluster/'s scenario (d): chaos. Two workers at ~`--chaos-load` of their slots with
streamed greedy requests while one of them is SIGKILLed every `--kill-every` s (alternately) and a
new one started in its place (the next kill waits until the gateway's /health lists it live), for
`--chaos-seconds`. Every stream is checked by cluster/stream.py: a final outcome, every token
exactly once (numbered by its logprobs entry: count == max_tokens == the gateway's usage), text
consistent with the tokens.

Why not compare each stream's text with a non-streamed greedy reference of the same prompt: greedy
decoding is not batch-invariant (on the tiny model at 6 streams, 70% of 200-token streams that were
never resumed differed from their own reference: batching moves near-ties), so a text mismatch
cannot tell a resume bug from numerics. The token count can.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.cluster.common import Ctx, ms, pct, target
from benchmarks.cluster.stream import StreamRecord, chat_body, stream
from benchmarks.harness.broker import Broker
from benchmarks.harness.common import log
from benchmarks.harness.procs import (
    Process,
    cluster_counters,
    engine_args,
    gateway,
    running_broker,
    wait_workers,
    worker,
)
from outpost.bench.prompts import COMMON_WORDS

SAMPLE_S = 0.5  # the in-flight timeline's resolution
PROGRESS_S = 15.0


@dataclass
class Kill:
    t_s: float  # since the load started
    victim: str
    replacement: str
    live_after_s: float | None = None  # from the kill until the replacement was live


class Fleet:
    """The two worker positions: kill one (SIGKILL) and start a replacement in its place."""

    def __init__(self, ctx: Ctx, broker: Broker, stack: ExitStack) -> None:
        self.ctx, self.broker, self.stack = ctx, broker, stack
        self.engine = engine_args(ctx.model, 1, ctx.args.chaos_slots)
        self.started = 0
        self.procs: list[Process] = [self._start(i) for i in range(2)]
        self.ids = [f"d-w{i}" for i in range(2)]

    def _start(self, pos: int) -> Process:
        wid = f"d-w{self.started}"
        self.started += 1
        return self.stack.enter_context(
            worker(self.broker, self.engine, self.ctx.worker_cpus(pos), self.ctx.logs, wid)
        )

    def kill_and_replace(self, pos: int, gw: str, t_s: float) -> Kill:
        """Blocking: kill position `pos`, start its replacement, wait until the gateway sees it."""
        t0 = time.monotonic()
        self.procs[pos].kill()
        victim = self.ids[pos]
        self.ids[pos] = f"d-w{self.started}"
        self.procs[pos] = self._start(pos)
        kill = Kill(round(t_s, 2), victim, self.ids[pos])
        log(f"(d) t={t_s:6.1f} s: SIGKILL {victim}; started {kill.replacement}")
        wait_workers(gw, 2, [self.procs[pos]], timeout=300, ids={self.ids[pos]})
        kill.live_after_s = round(time.monotonic() - t0, 2)
        return kill


def prompt_pool(args: Any) -> list[str]:
    """`--chaos-prompts` distinct prompts of about `--chaos-input-tokens` common words."""
    rng = random.Random(f"cluster-d:{args.seed}")
    words = list(COMMON_WORDS)
    return [
        " ".join(rng.choice(words) for _ in range(args.chaos_input_tokens)) for _ in range(args.chaos_prompts)
    ]


@dataclass
class Load:
    """The load's state, read by the sampler and the killer."""

    t0: float
    stop_at: float
    in_flight: int = 0
    records: list[StreamRecord] = field(default_factory=list)
    timeline: list[tuple[float, int]] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)

    def now(self) -> float:
        return time.perf_counter() - self.t0


async def _users(
    client: httpx.AsyncClient, model: str, pool: list[str], ctx: Ctx, load: Load, users: int
) -> None:
    extra = {"temperature": 0, **ctx.ban_eog()}

    async def user(u: int) -> None:
        i = u
        while time.perf_counter() < load.stop_at:
            k = i % len(pool)
            i += users
            record = StreamRecord(len(load.records), k, load.now(), ctx.args.chaos_max_tokens)
            load.records.append(record)
            load.in_flight += 1
            try:
                await stream(
                    client,
                    chat_body(model, pool[k], record.max_tokens, extra, True),
                    record,
                    ctx.args.timeout,
                )
            finally:
                load.in_flight -= 1

    await asyncio.gather(*(user(u) for u in range(users)))


async def _sampler(load: Load, done: asyncio.Event) -> None:
    """The in-flight timeline; a progress line on stderr every PROGRESS_S."""
    next_log = PROGRESS_S
    while not done.is_set():
        load.timeline.append((round(load.now(), 2), load.in_flight))
        if load.now() >= next_log:
            next_log += PROGRESS_S
            ended = [r for r in load.records if r.end_s is not None]
            ok = sum(r.outcome == "ok" and not r.faults() for r in ended)
            flight, kills = load.in_flight, len(load.kills)
            log(f"(d) t={load.now():6.1f} s: {len(ended)} ended, {ok} ok, {flight} in flight, {kills} kills")
        await asyncio.sleep(SAMPLE_S)


async def _killer(fleet: Fleet, gw: str, load: Load, every: float) -> None:
    k = 1
    while True:
        at = load.t0 + k * every
        if at >= load.stop_at:
            return
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        load.kills.append(await asyncio.to_thread(fleet.kill_and_replace, k % 2, gw, load.now()))
        k += 1


async def _chaos(ctx: Ctx, gw: str, fleet: Fleet, pool: list[str], users: int) -> Load:
    limits = httpx.Limits(max_connections=users + 8, max_keepalive_connections=users + 8)
    async with httpx.AsyncClient(
        base_url=gw, limits=limits, timeout=httpx.Timeout(ctx.args.timeout)
    ) as client:
        model = ctx.model.stem
        t0 = time.perf_counter()
        load = Load(t0, t0 + ctx.args.chaos_seconds)
        a = ctx.args
        log(f"(d): {users} streams for {a.chaos_seconds:g} s, a worker killed every {a.kill_every:g} s")
        done = asyncio.Event()
        sampler = asyncio.ensure_future(_sampler(load, done))
        await asyncio.gather(
            _users(client, model, pool, ctx, load, users), _killer(fleet, gw, load, ctx.args.kill_every)
        )
        done.set()
        await sampler
    return load


def _gap_stats(records: list[StreamRecord]) -> dict[str, Any]:
    gaps = [r.max_gap_s for r in records if r.max_gap_s is not None]
    return {
        "streams": len(records),
        "p50_ms": ms(pct(gaps, 50)),
        "p99_ms": ms(pct(gaps, 99)),
        "max_ms": ms(max(gaps, default=None)),
    }


def token_rate(records: list[StreamRecord], bin_s: float = 1.0) -> dict[str, list[float]]:
    """Tokens received per second over the run (each chunk counted by its tokens' arrival)."""
    bins: Counter[int] = Counter()
    for r in records:
        for t, n in zip(r.chunk_s, r.chunk_n, strict=True):
            bins[int((r.start_s + t) / bin_s)] += n
    last = max(bins, default=-1)
    return {
        "t_s": [i * bin_s for i in range(last + 1)],
        "tokens_per_s": [bins[i] / bin_s for i in range(last + 1)],
    }


def summarize(load: Load, counters: dict[str, float]) -> dict[str, Any]:
    recs = load.records
    outcomes = Counter(r.outcome for r in recs)
    faults = Counter(f for r in recs for f in r.faults())
    ok = [r for r in recs if r.outcome == "ok" and not r.faults()]
    resumed = [r for r in recs if r.outcome == "ok" and r.resumed_after > 0]
    others = [r for r in recs if r.outcome == "ok" and r.resumed_after == 0]
    n = len(recs)
    return {
        "requests": n,
        "ok": len(ok),
        "success_pct": round(100.0 * len(ok) / n, 3) if n else None,
        "without_final_outcome": outcomes.get("none", 0),
        "errors_by_code": dict(
            Counter(r.error or r.finish_reason or "?" for r in recs if r.outcome == "error")
        ),
        "no_outcome_detail": [f"{r.error}: {r.error_detail}" for r in recs if r.outcome == "none"][:10],
        "duplicated_tokens": sum(r.duplicated for r in recs),
        "missing_tokens": sum(r.missing for r in recs),
        "faults": dict(faults),
        "resumes_gateway": int(counters.get("resumes", 0)),
        "late_batches_dropped": int(counters.get("duplicates", 0)),
        "dead_lettered": int(counters.get("dead_lettered", 0)),
        "resumed_streams_seen": len(resumed),
        "max_gap_resumed": _gap_stats(resumed),
        "max_gap_others": _gap_stats(others),
        "kills": [vars(k) for k in load.kills],
    }


def scenario_d(ctx: Ctx) -> dict[str, Any]:
    a = ctx.args
    users = max(1, round(a.chaos_load * 2 * a.chaos_slots))
    with ExitStack() as stack:
        broker = stack.enter_context(running_broker(ctx.logs))
        fleet = Fleet(ctx, broker, stack)
        gw, _ = stack.enter_context(gateway(broker, ctx.model, ctx.logs, 1024))
        wait_workers(gw, 2, fleet.procs)
        load = asyncio.run(_chaos(ctx, gw, fleet, prompt_pool(a), users))
        counters = cluster_counters(gw)
    out = summarize(load, counters)
    out["setup"] = {
        "workers": 2,
        "engine": " ".join(fleet.engine[2:]),
        "worker_cpus": [ctx.worker_cpus(0), ctx.worker_cpus(1)],
        "streams": users,
        "max_tokens": a.chaos_max_tokens,
        "seconds": a.chaos_seconds,
        "kill_every_s": a.kill_every,
    }
    out["timeline"] = {"t_s": [t for t, _ in load.timeline], "in_flight": [v for _, v in load.timeline]}
    out["token_rate"] = token_rate(load.records)
    out["resumed_points"] = [
        [round(r.end_s or 0, 2), ms(r.max_gap_s)] for r in load.records if r.resumed_after > 0
    ]
    out["targets"] = [
        target("chaos: requests without a final outcome", out["without_final_outcome"], 0, True),
        target(
            "chaos: duplicated + missing tokens", out["duplicated_tokens"] + out["missing_tokens"], 0, True
        ),
        target("chaos: success %", out["success_pct"], 99.9, False),
    ]
    return out
