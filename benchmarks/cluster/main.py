"""Cluster benchmark: `outpost gateway` + RabbitMQ + `outpost worker`s (issue 12's proofs a-f).

Not a test. Run (on a quiet machine; one run, a few tens of minutes with the defaults):
    python -m benchmarks.cluster                       # every scenario, SmolLM2-135M-shaped q4_0
    python -m benchmarks.cluster --scenarios c,d --chaos-seconds 120
    taskset -c 1 python -m benchmarks.cluster --shape tiny --engine-cpus 1 --infra-cpus 1 \\
        --worker-cpus 1 --gateway-cpus 1 --fake-cpus 1 ...      # everything on one core (a try-out)

Everything runs on this machine, on loopback: a broker from scripts/broker.sh (free ports, a temp
state folder, fresh for each scenario), workers and gateways as `outpost worker` / `outpost gateway`
processes (their logs in OUT/logs/), load from this process. CPU pinning (taskset): `--engine-cpus`
and `--infra-cpus` for (a), `--worker-cpus` (worker i on the i-th, round robin) for (b)-(e),
`--gateway-cpus` and `--fake-cpus` for (f); "" leaves a part unpinned.

(a) the chat workload of `outpost bench` (distinct prompts of `--input-tokens`, streamed outputs of
    `--max-tokens` +- `--a-output-std`, end-of-generation banned; the users start over
    `--a-ramp-up` s) at 1 and 8 streams against `outpost serve` and against gateway + broker + one
    worker: the same engine flags (-np 8, -c 8192, -t = the count of --engine-cpus) on the same
    CPUs, both started together; the broker, the gateway and the load generator on --infra-cpus.
    `--a-rounds` rounds, serve and the gateway alternating. Added TTFT p50/p99 and the throughput
    ratio, read against two references measured in the same run: the broker's two hops timed with
    aio-pika alone (the floor any client of the broker pays, cluster/floor.py) and, unless
    --no-a-control, a second `outpost serve` as a control arm (serve vs serve: the run's resolution).
    Then, at 1 stream, `--a-paired` prompts each sent to serve and to the gateway back to back: the
    median per-pair difference is the added TTFT with the machine's drift taken out (cluster/paired.py).
(b) 1 vs 2 workers (-t 1 each, each on its own --worker-cpus core), 8 streams per worker: aggregate
    output tokens/s. The broker, the gateway and the load generator are not pinned: they share the
    cores with the workers.
(c) prefix-aware routing on vs off: 2 gateways, 2 workers whose KV holds at most 2 of 4 ~1,000-token
    system prompts; hit rate, TTFT, routing counters; then distinct prompts: throughput on / off
    (cluster/prefix.py).
(d) chaos: 2 workers at ~80% of their slots, one SIGKILLed and restarted every `--kill-every` s for
    `--chaos-seconds`; every stream checked for a final outcome and every token exactly once
    (cluster/chaos.py, cluster/stream.py).
(e) a burst of `--burst` requests sent at once at 2 workers of 4 slots behind a queue of 256.
(f) the gateway alone on a core against fake workers (benchmarks/cluster/fake_worker.py, no model):
    requests/s and concurrent open streams at the knee (benchmarks/cluster/gateway.py).
The fault matrix (cluster/faults.py; not in the default list, name them): restart-idle, restart,
    kill9, node-kill, worker-kill, worker-cut, gateway-cut, worker-kill-loop, e.g.
    python -m benchmarks.cluster --shape tiny --scenarios restart,kill9,node-kill --fault-seconds 60

Writes --out (default bench-results/cluster-<timestamp>/): results.json (after every scenario),
tables.md, a_ttft.png, c_prefix.png, d_chaos.png, f_gateway.png, logs/. Markdown tables go to
stderr; the last stdout line is a JSON summary (no raw samples).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.cluster.basic import scenario_a, scenario_b, scenario_e
from benchmarks.cluster.chaos import scenario_d
from benchmarks.cluster.common import Ctx
from benchmarks.cluster.faults import FAULT_SCENARIOS, add_flags
from benchmarks.cluster.faults_report import fault_table, plot_faults
from benchmarks.cluster.gateway import scenario_f
from benchmarks.cluster.plots import write_plots
from benchmarks.cluster.prefix import scenario_c
from benchmarks.cluster.report import format_all, summary
from benchmarks.harness.common import bench_model, log
from benchmarks.harness.servers import eog_tokens

SCENARIOS = {
    "a": scenario_a,
    "b": scenario_b,
    "c": scenario_c,
    "d": scenario_d,
    "e": scenario_e,
    "f": scenario_f,
    **FAULT_SCENARIOS,
}


def _general(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--scenarios", default="a,b,c,d,e,f", help=f"comma-separated, of {','.join(SCENARIOS)}")
    add("--shape", default="smollm2-135m", help="synthetic model shape (tiny for a quick try)")
    add("--quant", default="q4_0")
    add("--threads", type=int, default=len(os.sched_getaffinity(0)), help="(a) -t when --engine-cpus is ''")
    add("--seed", type=int, default=0, help="prompts of (c) and (d)")
    add("--timeout", type=float, default=900.0, help="seconds per request, at most")
    add("--out", type=Path, help="results folder (default bench-results/cluster-<timestamp>)")
    add("--engine-cpus", default="1", help="(a) serve's and the worker's CPUs")
    add("--infra-cpus", default="0", help="(a) the broker's, the gateway's and the load generator's CPUs")
    add("--worker-cpus", default="0,1", help="(b-e) worker i's CPU: the i-th of the list, round robin")


def _scenario_flags(p: argparse.ArgumentParser) -> None:
    add = p.add_argument
    add("--requests", type=int, default=32, help="(b) measured requests per worker")
    add("--warmup", type=int, default=4, help="(a, b) warmup requests per level")
    add("--a-rounds", type=int, default=3, help="(a) rounds, serve and gateway alternating")
    add(
        "--a-control",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="(a) a second serve as a control arm",
    )
    add(
        "--a-paired", type=int, default=48, help="(a) prompts sent to serve and gateway back to back; 0: none"
    )
    add("--a-requests", type=int, default=48, help="(a) measured requests per level and round")
    add("--a-output-std", type=float, default=16.0, help="(a) output tokens' standard deviation")
    add("--a-ramp-up", type=float, default=4.0, help="(a) seconds over which the closed-loop users start")
    add("--max-tokens", type=int, default=64, help="(a, b, e) output tokens")
    add("--input-tokens", type=int, default=120, help="(a, b, e) prompt tokens")
    add("--prefix-tokens", type=int, default=1000, help="(c) tokens of each of the 4 system prompts")
    add("--turn-tokens", default="20,60", help="(c) user turn tokens: LOW,HIGH (uniform)")
    add("--turn-max-tokens", default="16,32", help="(c) output tokens: LOW,HIGH (uniform)")
    add("--prefix-slots", type=int, default=8, help="(c) slots per worker")
    add("--prefix-ctx", type=int, help="(c) KV cells per worker (default: 2.5 prefixes)")
    add("--prefix-streams", type=int, default=8, help="(c) closed-loop users, split over the 2 gateways")
    add("--prefix-workloads", default="shared,distinct", help="(c) which workloads: shared, distinct")
    add("--prefix-warmup", type=int, default=16, help="(c) warmup requests per run")
    add("--prefix-requests", type=int, default=64, help="(c) measured requests per run")
    add("--chaos-seconds", type=float, default=300.0, help="(d) how long the chaos lasts")
    add("--kill-every", type=float, default=20.0, help="(d) seconds between kills")
    add("--chaos-slots", type=int, default=4, help="(d) slots per worker")
    add("--chaos-load", type=float, default=0.8, help="(d) streams = this x all slots")
    add("--chaos-max-tokens", type=int, default=64, help="(d) output tokens per stream")
    add("--chaos-input-tokens", type=int, default=48, help="(d) words per prompt")
    add("--chaos-prompts", type=int, default=32, help="(d) distinct prompts, cycled")
    add("--burst", type=int, default=200, help="(e) requests sent at once")
    add("--gateway-cpus", default="0", help="(f) the gateway's CPUs (alone)")
    add("--fake-cpus", default="1", help="(f) the broker's, fake workers' and load generator's CPUs")
    add("--fake-workers", type=int, default=2, help="(f) fake workers")
    add("--gw-rate-levels", default="1,2,4,8,16,32,64,128", help="(f) closed-loop users per level")
    add("--gw-seconds", type=float, default=10.0, help="(f) seconds per request-rate level")
    add("--gw-tokens", type=int, default=8, help="(f) tokens per non-streamed answer")
    add("--gw-latency-limit", type=float, default=1.0, help="(f) stop the rate sweep past this p50 (s)")
    add("--gw-stream-levels", default="50,100,200,400,800,1600", help="(f) concurrent streams per level")
    add("--gw-stream-tokens", type=int, default=20, help="(f) tokens per stream")
    add("--gw-stream-interval", type=float, default=0.5, help="(f) seconds between a stream's tokens")
    add_flags(add)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    _general(p)
    _scenario_flags(p)
    args = p.parse_args()
    names = [n.strip() for n in args.scenarios.split(",") if n.strip()]
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown or not names:
        p.error(f"unknown --scenarios {unknown}; choose from {','.join(SCENARIOS)}")
    args.scenario_list = names
    for flag in ("engine_cpus", "infra_cpus", "gateway_cpus", "fake_cpus"):
        setattr(args, flag, getattr(args, flag) or None)  # "": not pinned
    return args


def run_scenario(name: str, ctx: Ctx) -> dict[str, Any]:
    """One scenario; a failure is recorded (the others still run)."""
    log(f"\n== scenario ({name})")
    t0 = time.monotonic()
    try:
        result = SCENARIOS[name](ctx)
    except Exception as exc:  # a long run keeps what the other scenarios measured
        log(traceback.format_exc())
        result = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    result["seconds"] = round(time.monotonic() - t0, 1)
    return result


def main() -> None:
    args = parse_args()
    out = args.out or Path("bench-results") / time.strftime("cluster-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    model = bench_model(args.shape, args.quant)
    ctx = Ctx(args, model, eog_tokens(model), out)
    results: dict[str, Any] = {
        "shape": args.shape,
        "quant": args.quant,
        "cpus": sorted(os.sched_getaffinity(0)),
        "command": {k: v for k, v in vars(args).items() if k not in ("out", "scenario_list")},
    }
    for name in args.scenario_list:
        results[name] = run_scenario(name, ctx)
        (out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    tables = format_all(results)
    if any(n in results for n in FAULT_SCENARIOS):
        tables += "\n\n### The fault matrix\n\n" + fault_table(results)
    (out / "tables.md").write_text(tables + "\n")
    log("\n" + tables)
    for path in [*write_plots(results, out), plot_faults(results, out)]:
        if path is not None:
            log(f"wrote {path}")
    log(f"\nresults in {out}")
    print(json.dumps(summary(results), separators=(",", ":"), default=str))
