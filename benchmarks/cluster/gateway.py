"""benchmarks/cluster/'s scenario (f): the gateway alone, against fake workers (no model).

The gateway is pinned alone to `--gateway-cpus`; the broker, the fake workers
(benchmarks/cluster/fake_worker.py: the real Worker over an engine that answers at once or at a fixed
pace) and this load generator share `--fake-cpus`. Two sweeps, each level bounded in time:

- request rate: short non-streamed chat requests (`--gw-tokens` tokens, answered at once) from
  closed-loop users at each of `--gw-rate-levels`, for `--gw-seconds` each, until errors pass 1%
  or p50 latency passes `--gw-latency-limit`. The knee: the fewest users reaching 95% of the best
  error-free requests/s.
- open streams: `--gw-stream-levels` concurrent streams (starts spread over one token interval),
  each `--gw-stream-tokens` tokens, one every `--gw-stream-interval` s, until a level is not
  sustained: every stream complete, and p99 of the longest wait between tokens <= 2 intervals.

Per level the CPU each part used (% of one core, from /proc): when the gateway is near 100%, it is
the bottleneck; when the broker, the fake workers or the load generator are, the figure is theirs.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from contextlib import ExitStack
from typing import Any

from benchmarks.cluster.common import Ctx, ms, pct
from benchmarks.cluster.http1 import NET_ERRORS, HttpConnection, stream
from benchmarks.cluster.stream import StreamRecord, chat_body
from benchmarks.harness.broker import Broker
from benchmarks.harness.common import log
from benchmarks.harness.procs import (
    Process,
    cpu_seconds,
    fake_worker,
    gateway,
    pinned,
    running_broker,
    wait_workers,
)

ERROR_LIMIT = 0.01
GAP_LIMIT = 2.0  # intervals: a stream's longest wait between tokens may be this many


def ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


class Cpu:
    """CPU seconds of the gateway, the broker, the fake workers and this process, between marks."""

    def __init__(self, gateway_pid: int, broker: Broker, fakes: list[Process]) -> None:
        self.pids: dict[str, list[int | None]] = {
            "gateway": [gateway_pid],
            "broker": [broker.pid],
            "fake_workers": [p.pid for p in fakes],
            "load_generator": [os.getpid()],
        }
        self._mark = self._read()

    def _read(self) -> tuple[float, dict[str, float]]:
        return time.monotonic(), {k: sum(cpu_seconds(p) or 0.0 for p in v) for k, v in self.pids.items()}

    def mark(self) -> None:
        self._mark = self._read()

    def since(self) -> dict[str, float]:
        """% of one core each used since the last mark."""
        (t0, before), (t1, after) = self._mark, self._read()
        return {k: round(100.0 * (after[k] - before[k]) / max(t1 - t0, 1e-9), 1) for k in after}


def _fakes(
    ctx: Ctx, broker: Broker, stack: ExitStack, slots: int, interval: float, tag: str
) -> list[Process]:
    a = ctx.args
    return [
        stack.enter_context(
            fake_worker(broker, ctx.model.stem, slots, interval, a.fake_cpus, ctx.logs, f"f-{tag}-{i}")
        )
        for i in range(a.fake_workers)
    ]


def _body(ctx: Ctx, i: int) -> dict[str, Any]:
    return {
        "model": ctx.model.stem,
        "messages": [{"role": "user", "content": f"hello {i}"}],
        "max_tokens": ctx.args.gw_tokens,
    }


async def _rate_level(gw: str, ctx: Ctx, users: int, seconds: float) -> dict[str, Any]:
    """`users` closed-loop users, each on its own keep-alive connection, for `seconds`."""
    latencies: list[float] = []
    errors: Counter[str] = Counter()
    stop_at = time.perf_counter() + seconds

    async def user(u: int) -> None:
        conn, i = HttpConnection(gw), u
        try:
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                try:
                    body = json.dumps(_body(ctx, i)).encode()
                    status, _ = await asyncio.wait_for(
                        conn.post("/v1/chat/completions", body), ctx.args.timeout
                    )
                    key = None if status == 200 else str(status)
                except NET_ERRORS as exc:
                    key = type(exc).__name__
                    await conn.close()
                if key is None:
                    latencies.append(time.perf_counter() - t)
                else:
                    errors[key] += 1
                i += users
        finally:
            await conn.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(user(u) for u in range(users)))
    wall = time.perf_counter() - t0
    n_err = sum(errors.values())
    return {
        "users": users,
        "requests": len(latencies) + n_err,
        "requests_per_s": round(len(latencies) / wall, 1),
        "errors": n_err,
        "errors_by_code": dict(errors),
        "latency_ms": {"p50": ms(pct(latencies, 50)), "p99": ms(pct(latencies, 99))},
    }


def _too_slow(row: dict[str, Any], limit_s: float) -> bool:
    p50 = row["latency_ms"]["p50"] or 0
    return row["errors"] > ERROR_LIMIT * max(1, row["requests"]) or p50 > limit_s * 1000


async def _rate_sweep(gw: str, ctx: Ctx, cpu: Cpu) -> list[dict[str, Any]]:
    a = ctx.args
    levels = ints(a.gw_rate_levels)
    rows = []
    await _rate_level(gw, ctx, min(4, max(levels)), 2.0)  # warmup: caches, the first connections
    for users in levels:
        cpu.mark()
        row = await _rate_level(gw, ctx, users, a.gw_seconds)
        row["cpu_pct"] = cpu.since()
        rows.append(row)
        log(f"(f) rate: {row}")
        if _too_slow(row, a.gw_latency_limit):
            break
    return rows


def rate_knee(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fewest users that reach 95% of the best requests/s among levels with <= 1% errors."""
    good = [r for r in rows if r["errors"] <= ERROR_LIMIT * max(1, r["requests"])]
    if not good:
        return None
    best = max(r["requests_per_s"] for r in good)
    knee = min((r for r in good if r["requests_per_s"] >= 0.95 * best), key=lambda r: r["users"])
    return {"users": knee["users"], "requests_per_s": knee["requests_per_s"], "best_requests_per_s": best}


async def _stream_level(gw: str, ctx: Ctx, n: int) -> dict[str, Any]:
    a = ctx.args
    interval, tokens = a.gw_stream_interval, a.gw_stream_tokens
    timeout = tokens * interval * 3 + 60
    records = [StreamRecord(i, 0, 0.0, tokens) for i in range(n)]

    async def one(r: StreamRecord) -> None:
        await asyncio.sleep(r.index * interval / n)  # starts spread over one token interval
        await stream(gw, chat_body(ctx.model.stem, f"stream {r.index}", tokens, {}, False), r, timeout)

    await asyncio.gather(*(one(r) for r in records))
    complete = [
        r for r in records if r.outcome == "ok" and r.chunks == tokens and not r.faults(logprobs=False)
    ]
    done = {r.index for r in complete}
    gaps = [r.max_gap_s for r in complete if r.max_gap_s is not None]
    ttfts = [r.ttft_s for r in complete if r.ttft_s is not None]
    p99_gap = pct(gaps, 99)
    return {
        "streams": n,
        "complete": len(complete),
        "failed": n - len(complete),
        "errors_by_code": dict(Counter(r.error or r.outcome for r in records if r.index not in done)),
        "ttft_ms": {"p50": ms(pct(ttfts, 50)), "p99": ms(pct(ttfts, 99))},
        "max_gap_ms": {"p50": ms(pct(gaps, 50)), "p99": ms(p99_gap)},
        "sustained": len(complete) == n and p99_gap is not None and p99_gap <= GAP_LIMIT * interval,
    }


async def _stream_sweep(gw: str, ctx: Ctx, cpu: Cpu) -> list[dict[str, Any]]:
    rows = []
    for n in ints(ctx.args.gw_stream_levels):
        cpu.mark()
        row = await _stream_level(gw, ctx, n)
        row["cpu_pct"] = cpu.since()
        rows.append(row)
        log(f"(f) streams: {row}")
        if not row["sustained"]:
            break
    return rows


def _wait_fakes(gw: str, fakes: list[Process]) -> None:
    ids = {p.name.split("@")[0].removeprefix("fake-") for p in fakes}
    wait_workers(gw, len(fakes), fakes, timeout=120, ids=ids)


def scenario_f(ctx: Ctx) -> dict[str, Any]:
    a = ctx.args
    n = a.fake_workers
    rate_slots = max(ints(a.gw_rate_levels)) // n + 16
    stream_slots = max(ints(a.gw_stream_levels)) // n + 16
    with ExitStack() as stack:
        stack.enter_context(pinned(a.fake_cpus))
        broker = stack.enter_context(running_broker(ctx.logs, a.fake_cpus))
        gw, gproc = stack.enter_context(gateway(broker, ctx.model, ctx.logs, 100_000, a.gateway_cpus))
        with ExitStack() as fakes_stack:
            fakes = _fakes(ctx, broker, fakes_stack, rate_slots, 0.0, "rate")
            _wait_fakes(gw, fakes)
            rate = asyncio.run(_rate_sweep(gw, ctx, Cpu(gproc.pid, broker, fakes)))
        with ExitStack() as fakes_stack:
            fakes = _fakes(ctx, broker, fakes_stack, stream_slots, a.gw_stream_interval, "stream")
            _wait_fakes(gw, fakes)
            streams = asyncio.run(_stream_sweep(gw, ctx, Cpu(gproc.pid, broker, fakes)))
    sustained = [r["streams"] for r in streams if r["sustained"]]
    return {
        "setup": {
            "gateway_cpus": a.gateway_cpus,
            "fake_cpus": a.fake_cpus,
            "fake_workers": n,
            "slots_per_fake_worker": {"rate": rate_slots, "streams": stream_slots},
            "rate": f"non-streamed, {a.gw_tokens} tokens answered at once, {a.gw_seconds:g} s per level",
            "streams": f"{a.gw_stream_tokens} tokens, one every {a.gw_stream_interval:g} s",
        },
        "rate": rate,
        "rate_knee": rate_knee(rate),
        "streams": streams,
        "streams_sustained": max(sustained, default=None),
    }
