"""benchmarks/cluster/'s fault matrix (issue 28): the broker and the links fail under load.

Each scenario starts a broker (scripts/broker.sh, one node or `--nodes 3`), two workers (the run's
synthetic model, `--fault-slots` slots each) and a gateway, runs `--fault-load` x all slots of
closed-loop streamed greedy chats (every end-of-generation token banned, logprobs on: each token
numbered, cluster/stream.py) for `--fault-seconds`, and breaks something `--fault-at` s in:

  restart-idle   the broker stopped and started with nothing in flight, then the load
  restart        the broker stopped and started (scripts/broker.sh stop; start) under load
  kill9          the broker's Erlang VM SIGKILLed, then started again, under load
  node-kill      3 nodes; the node everyone connected to first SIGKILLed, booted again
                 `--fault-down` s later (it rejoins), under load
  worker-kill    one of the two workers SIGKILLed (not started again): its streams resume on the
                 other, whose slots are busy (overcommitted: `--fault-load 2`)
  worker-cut     one worker in a network namespace of its own (cluster/.. harness/netns.py): its
                 veth pair down for `--fault-down` s (no TCP reset), then up
  gateway-cut    the gateway in a namespace (clients reach it over a second pair that stays up):
                 its pair to the broker down for `--fault-down` s
  worker-kill-loop  scenario (d) (a worker SIGKILLed every `--kill-every` s at ~80% load) for
                 `--duration` s (default 600)

A client that gets 503 (the gateway has no broker yet) waits its Retry-After (at most 2 s) and
sends again, up to 60 times; `success_with_retry_pct` counts final outcomes only. Per scenario:
requests, outcomes (ok / clear error / none), duplicated and missing tokens, 503s retried, and the
longest pause of each stream, p50/p99 over all streams and over those in flight at the fault,
and the resume gap (fault_gaps.py: from the fault's end to the next token of each stream that was
producing tokens when it hit; target p99 < 5 s). `--fault-load 2` overcommits: twice as many
streams as slots, so as many wait in the queue as decode.
The namespace scenarios need root and `ip netns`; elsewhere they are recorded as skipped.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.cluster.chaos import prompt_pool, scenario_d
from benchmarks.cluster.common import Ctx, ms, pct, target
from benchmarks.cluster.fault_gaps import resume_gaps
from benchmarks.cluster.stream import StreamRecord, chat_body, stream
from benchmarks.harness.broker import Broker
from benchmarks.harness.common import log, wait_ready
from benchmarks.harness.netns import Host, Link, unavailable
from benchmarks.harness.ports import free_port
from benchmarks.harness.procs import (
    OUTPOST,
    Process,
    cluster_counters,
    engine_args,
    running_broker,
    wait_workers,
)

RETRIES_503 = 60
ACCEPT_WAIT_S = 300.0  # bound on waiting for a restarted broker's listener
SUBNET = "10.214.{}.{}"


@dataclass
class Load:
    t0: float
    stop_at: float
    records: list[StreamRecord] = field(default_factory=list)
    refused_503: int = 0
    events: list[tuple[float, str]] = field(default_factory=list)
    in_flight_at_fault: set[int] = field(default_factory=set)
    in_flight: set[int] = field(default_factory=set)
    issued: int = 0  # attempts so far: each its own index (a retried 503 leaves `records`)
    fault_s: float | None = None  # when the fault hit
    fault_end_s: float | None = None  # when it ended: broker back, node gone, link up, worker gone

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def mark(self, what: str, ends: bool = False) -> None:
        self.events.append((round(self.now(), 2), what))
        if ends:
            self.fault_end_s = self.now()
        log(f"(faults) t={self.now():6.1f} s: {what}")


async def _attempt(
    client: httpx.AsyncClient, body: dict[str, Any], load: Load, k: int, ctx: Ctx
) -> StreamRecord:
    """One request, sent again after each 503 (its Retry-After, at most 2 s): the final attempt."""
    for _ in range(RETRIES_503):
        record = StreamRecord(load.issued, k, load.now(), body["max_tokens"])
        load.issued += 1
        load.in_flight.add(record.index)
        load.records.append(record)
        try:
            await stream(client, body, record, ctx.args.timeout)
        finally:
            load.in_flight.discard(record.index)
        if record.status != 503:
            return record
        load.records.remove(record)  # this attempt's own: other users append theirs meanwhile
        load.refused_503 += 1
        await asyncio.sleep(2.0)
    return record


async def _users(ctx: Ctx, gw: str, users: int, load: Load) -> None:
    pool = prompt_pool(ctx.args)
    extra = {"temperature": 0, **ctx.ban_eog()}
    limits = httpx.Limits(max_connections=users + 8, max_keepalive_connections=users + 8)
    async with httpx.AsyncClient(
        base_url=gw, limits=limits, timeout=httpx.Timeout(ctx.args.timeout)
    ) as client:

        async def user(u: int) -> None:
            i = u
            while time.perf_counter() < load.stop_at:
                k = i % len(pool)
                i += users
                body = chat_body(ctx.model.stem, pool[k], ctx.args.chaos_max_tokens, extra, True)
                await _attempt(client, body, load, k, ctx)

        await asyncio.gather(*(user(u) for u in range(users)))


async def _run_load(ctx: Ctx, gw: str, users: int, fault: Callable[[Load], None] | None) -> Load:
    a = ctx.args
    t0 = time.perf_counter()
    load = Load(t0, t0 + a.fault_seconds)

    async def breaker() -> None:
        if fault is None:
            return
        await asyncio.sleep(a.fault_at)
        load.in_flight_at_fault = set(load.in_flight)
        load.fault_s = load.now()
        await asyncio.to_thread(fault, load)

    await asyncio.gather(_users(ctx, gw, users, load), breaker())
    return load


def _pauses(records: list[StreamRecord]) -> dict[str, Any]:
    gaps = [r.max_gap_s for r in records if r.max_gap_s is not None]
    return {
        "streams": len(gaps),
        "p50_ms": ms(pct(gaps, 50)),
        "p99_ms": ms(pct(gaps, 99)),
        "max_ms": ms(max(gaps, default=None)),
    }


def summarize(load: Load, counters: dict[str, float]) -> dict[str, Any]:
    recs = load.records
    outcomes = Counter(r.outcome for r in recs)
    ok = [r for r in recs if r.outcome == "ok" and not r.faults()]
    n = len(recs)
    at_fault = [r for r in recs if r.index in load.in_flight_at_fault]
    return {
        "requests": n,
        "ok": len(ok),
        "clear_errors": outcomes.get("error", 0),
        "without_final_outcome": outcomes.get("none", 0),
        "errors_by_code": dict(
            Counter(
                f"{r.error or r.finish_reason}: {r.error_detail[:80]}" for r in recs if r.outcome == "error"
            )
        ),
        "duplicated_tokens": sum(r.duplicated for r in recs),
        "missing_tokens": sum(r.missing for r in recs),
        "faults": dict(Counter(f for r in recs for f in r.faults())),
        "refused_503_retried": load.refused_503,
        "success_with_retry_pct": round(100.0 * len(ok) / n, 3) if n else None,
        "in_flight_at_fault": len(at_fault),
        "in_flight_at_fault_ok": sum(r.outcome == "ok" and not r.faults() for r in at_fault),
        "pause_all": _pauses([r for r in recs if r.outcome == "ok"]),
        "pause_at_fault": _pauses([r for r in at_fault if r.outcome == "ok"]),
        "resume_gap": resume_gaps(recs, load.in_flight_at_fault, load.fault_s, load.fault_end_s),
        "resumes_gateway": int(counters.get("resumes", 0)),
        "dead_lettered": int(counters.get("dead_lettered", 0)),
        "events": load.events,
        "timeline": {
            "t_s": [round(r.start_s, 2) for r in recs],
            "max_gap_ms": [ms(r.max_gap_s) for r in recs],
        },
    }


def _targets(name: str, out: dict[str, Any]) -> list[dict[str, Any]]:
    found = [
        target(f"{name}: requests without a final outcome", out["without_final_outcome"], 0, True),
        target(
            f"{name}: duplicated + missing tokens", out["duplicated_tokens"] + out["missing_tokens"], 0, True
        ),
        target(f"{name}: success % (503 retried)", out["success_with_retry_pct"], 99.9, False),
    ]
    if name == "node-kill":
        found.append(target("node-kill: stream pause p99 (ms)", out["pause_all"]["p99_ms"], 5000, True))
    if name != "restart-idle":
        gap = out["resume_gap"]["p99_ms"]
        found.append(target(f"{name}: fault end to next token p99 (ms)", gap, 5000, True))
    return found


@contextmanager
def _gateway(
    ctx: Ctx, broker: Broker, host: Host | None = None, client: Link | None = None, via: Link | None = None
) -> Iterator[str]:
    """A ready gateway (in `host`, reached over `client`, to the broker over `via`, when given)."""
    port = free_port()
    bind = client.ns_addr if client is not None else "127.0.0.1"
    args = [*OUTPOST, "gateway", *broker.flags(via.host_addr if via else None), "-m", str(ctx.model)]
    args += ["--broker-management-url", broker.mgmt_url, "--host", bind, "--port", str(port)]
    args += ["--broker-outage", "120"]
    url = f"http://{bind}:{port}"
    with Process(f"gateway-{port}", host.argv(args) if host else args, None, ctx.logs) as proc:
        wait_ready(url, proc.proc)
        yield url


def _worker(
    ctx: Ctx, broker: Broker, name: str, host: Host | None = None, via: Link | None = None
) -> Process:
    engine = engine_args(ctx.model, 1, ctx.args.fault_slots)
    args = [*OUTPOST, "worker", *broker.flags(via.host_addr if via else None), *engine, "--worker-id", name]
    return Process(name, host.argv(args) if host else args, None, ctx.logs)


def _cut(link: Link, seconds: float) -> Callable[[Load], None]:
    def fault(load: Load) -> None:
        load.mark(f"link {link.host_dev} down")
        link.down()
        try:
            time.sleep(seconds)  # the outage's length
        finally:
            link.up()
            load.mark(f"link {link.host_dev} up", ends=True)

    return fault


def _broker_fault(broker: Broker, name: str, down_s: float) -> Callable[[Load], None]:
    def fault(load: Load) -> None:
        if name == "restart":
            load.mark("broker stop")
            broker.stop()
        else:
            load.mark("kill -9 of node 1", ends=name == "node-kill")  # node-kill: the node gone
            broker.kill9(1)
            if name == "node-kill":
                time.sleep(down_s)  # node 1 stays down while the other two serve
        load.mark("broker start")
        if name == "node-kill":
            broker.start()
            load.mark("broker started")
            return
        watch = threading.Thread(target=_mark_accepting, args=(broker.amqp_port, load), daemon=True)
        watch.start()
        broker.start()
        watch.join(ACCEPT_WAIT_S)
        load.mark("broker started", ends=load.fault_end_s is None)

    return fault


def _mark_accepting(port: int, load: Load) -> None:
    """Marks the fault's end when the broker accepts connections again: before its start command
    returns (that also waits for the node's boot to settle), which is when clients can reconnect."""
    deadline = time.monotonic() + ACCEPT_WAIT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                load.mark("broker accepting connections", ends=True)
                return
        except OSError:
            time.sleep(0.1)


def _kill(worker: Process) -> Callable[[Load], None]:
    def fault(load: Load) -> None:
        worker.kill()
        load.mark(f"{worker.name} SIGKILLed", ends=True)

    return fault


def _fault_run(ctx: Ctx, name: str) -> dict[str, Any]:
    a = ctx.args
    users = max(1, round(a.fault_load * 2 * a.fault_slots))
    cut = name in ("worker-cut", "gateway-cut")
    why = unavailable() if cut else None
    if why:
        return {"skipped": why}
    with ExitStack() as stack:
        hosts: list[Host] = []
        stack.callback(lambda: [h.remove() for h in hosts])
        third = 100 + os.getpid() % 150
        ns_host = links = None
        if cut:
            ns_host = Host(f"opb-{name[:1]}{os.getpid() % 10000}")
            hosts.append(ns_host)
            links = [
                ns_host.link(f"opb{name[:1]}{i}{os.getpid() % 1000}", SUBNET.format(third, 4 * i))
                for i in range(2)
            ]
        listen = (links[0].host_addr,) if links else ()
        broker = stack.enter_context(running_broker(ctx.logs, None, 3 if name == "node-kill" else 1, listen))
        procs = [
            stack.enter_context(
                _worker(
                    ctx,
                    broker,
                    f"{name}-w{i}",
                    ns_host if name == "worker-cut" and i == 0 else None,
                    links[0] if name == "worker-cut" and i == 0 else None,
                )
            )
            for i in range(2)
        ]
        if name == "gateway-cut":
            assert ns_host is not None and links is not None
            gw = stack.enter_context(_gateway(ctx, broker, ns_host, links[1], links[0]))
        else:
            gw = stack.enter_context(_gateway(ctx, broker))
        wait_workers(gw, 2, procs)
        fault: Callable[[Load], None] | None
        if cut:
            assert links is not None
            fault = _cut(links[0], a.fault_down)
        elif name == "worker-kill":
            fault = _kill(procs[0])
        elif name == "restart-idle":
            t = time.monotonic()
            broker.stop()
            broker.start()
            wait_workers(gw, 2, procs)
            back = round(time.monotonic() - t, 2)
            fault = None
        else:
            fault = _broker_fault(broker, name, a.fault_down)
        load = asyncio.run(_run_load(ctx, gw, users, fault))
        counters = cluster_counters(gw)
    out = summarize(load, counters)
    if name == "restart-idle":
        out["restart_to_workers_live_s"] = back
    out["setup"] = {
        "workers": 2,
        "slots": a.fault_slots,
        "streams": users,
        "seconds": a.fault_seconds,
        "fault_at_s": a.fault_at,
        "down_s": a.fault_down,
        "nodes": broker.nodes,
    }
    out["targets"] = _targets(name, out)
    return out


def _scenario(name: str) -> Callable[[Ctx], dict[str, Any]]:
    def run(ctx: Ctx) -> dict[str, Any]:
        return _fault_run(ctx, name)

    run.__name__ = f"scenario_{name.replace('-', '_')}"
    return run


def worker_kill_loop(ctx: Ctx) -> dict[str, Any]:
    """Scenario (d) for --duration s."""
    saved = ctx.args.chaos_seconds
    ctx.args.chaos_seconds = ctx.args.duration
    try:
        return scenario_d(ctx)
    finally:
        ctx.args.chaos_seconds = saved


FAULT_SCENARIOS: dict[str, Callable[[Ctx], dict[str, Any]]] = {
    **{
        n: _scenario(n)
        for n in ("restart-idle", "restart", "kill9", "node-kill", "worker-kill", "worker-cut", "gateway-cut")
    },
    "worker-kill-loop": worker_kill_loop,
}


def add_flags(add: Callable[..., Any]) -> None:
    add("--fault-seconds", type=float, default=60.0, help="(faults) seconds of load per scenario")
    add("--fault-at", type=float, default=15.0, help="(faults) seconds into the load the fault comes")
    add("--fault-down", type=float, default=15.0, help="(faults) seconds a cut link / killed node stays down")
    add("--fault-slots", type=int, default=4, help="(faults) slots per worker")
    add(
        "--fault-load",
        type=float,
        default=0.8,
        help="(faults) streams = this x all slots (2: as many queued)",
    )
    add("--duration", type=float, default=600.0, help="(worker-kill-loop) seconds")
