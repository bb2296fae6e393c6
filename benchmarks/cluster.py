"""Cluster benchmark: `outpost gateway` + RabbitMQ + `outpost worker`s (issue 12's Proof a, b, e).

Not a test. Run:  python benchmarks/cluster.py [--scenarios a,b,e] [--shape smollm2-135m] [--requests 32]

Everything on this machine, on loopback: a broker from scripts/broker.sh (free ports, a temp state
folder), workers and gateways as `outpost worker` / `outpost gateway` processes, load from `outpost
bench`'s runner (the chat workload of benchmarks/serve.py: distinct prompts of `--input-tokens`,
`--max-tokens` streamed outputs with every end-of-generation token banned).

(a) the same closed-loop workload at 1 and 8 streams against one model served directly (`outpost
    serve`) and through a gateway + RabbitMQ + one worker with the same slots and threads (`outpost
    bench --compare` style: each level runs on each target in turn): added TTFT p50/p99, throughput
    ratio.
(b) 1 vs 2 workers, each pinned to its own core (`taskset`, `-t 1`), 8 streams per worker: the
    aggregate output tokens/s ratio. The broker, the gateway and the load generator share the cores.
(e) a burst of `--burst` concurrent requests at 2 workers of 4 slots with a queue of 256: how many
    were answered and how many rejected.

Tables to stderr; results.json in --out; the last stdout line is a JSON summary of the scenarios.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO, Any

import httpx
from common import bench_model, free_port, log, wait_ready
from servers import eog_tokens

from outpost.bench.config import BenchConfig, ServerTarget, make_plan, make_scenario
from outpost.bench.progress import Progress
from outpost.bench.records import BenchResult, RunSummary
from outpost.bench.report import format_tables
from outpost.bench.runner import run_bench_sync

OUTPOST = [sys.executable, "-m", "outpost.cli"]
BROKER_SH = Path(__file__).resolve().parents[1] / "scripts" / "broker.sh"


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (held together while picked, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class Broker:
    """scripts/broker.sh on free loopback ports in a temp folder; stopped on exit."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="outpost-bench-broker-"))
        self.port, dist, epmd, self.mgmt_port = free_ports(4)
        self.env = dict(
            os.environ,
            OUTPOST_BROKER_DIR=str(self.dir),
            OUTPOST_BROKER_PORT=str(self.port),
            OUTPOST_BROKER_DIST_PORT=str(dist),
            OUTPOST_BROKER_EPMD_PORT=str(epmd),
            OUTPOST_BROKER_MGMT_PORT=str(self.mgmt_port),
        )
        self.url = f"amqp://outpost@127.0.0.1:{self.port}/"
        self.password_file = self.dir / "password"
        self.mgmt_url = f"http://127.0.0.1:{self.mgmt_port}/"

    def __enter__(self) -> Broker:
        subprocess.run([str(BROKER_SH), "start"], env=self.env, check=True, timeout=900, stdout=sys.stderr)
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([str(BROKER_SH), "stop"], env=self.env, check=False, timeout=300)

    def flags(self) -> list[str]:
        return ["--broker", self.url, "--broker-password-file", str(self.password_file)]


class Process:
    """An `outpost` subcommand, optionally pinned to CPUs with taskset; SIGTERM (then kill) on exit."""

    def __init__(self, name: str, args: list[str], cpus: str | None = None) -> None:
        self.name = name
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        pin = ["taskset", "-c", cpus] if cpus else []
        self.proc = subprocess.Popen([*pin, *OUTPOST, *args], stdout=subprocess.DEVNULL, stderr=self._err)

    def stderr_tail(self) -> str:
        self._err.seek(0)
        return self._err.read().decode(errors="replace")[-3000:]

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


def server_args(model: Path, threads: int, slots: int) -> list[str]:
    return ["-m", str(model), "-t", str(threads), "-np", str(slots), "-c", str(1024 * slots)]


def wait_workers(gateway_url: str, n: int, proc: Process, timeout: float = 600.0) -> None:
    """Until the gateway's /health lists `n` live workers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{proc.name} exited {proc.proc.returncode}:\n{proc.stderr_tail()}")
        try:
            workers = httpx.get(f"{gateway_url}/health", timeout=5).json().get("workers", [])
            if len(workers) >= n:
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.25)
    raise TimeoutError(f"{n} workers not live at {gateway_url} within {timeout} s")


@contextmanager
def gateway(broker: Broker, model: Path, max_queue: int, cpus: str | None = None) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = ["gateway", *broker.flags(), "--broker-management-url", broker.mgmt_url, "-m", str(model)]
    with Process("gateway", [*args, "--port", str(port), "--max-queue", str(max_queue)], cpus) as proc:
        try:
            wait_ready(url, proc.proc)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"gateway not ready: {exc}\n{proc.stderr_tail()}") from exc
        yield url


def worker(broker: Broker, model: Path, threads: int, slots: int, cpus: str | None) -> Process:
    return Process(
        f"worker@{cpus or 'all'}", ["worker", *broker.flags(), *server_args(model, threads, slots)], cpus
    )


def bench(
    targets: dict[str, str], levels: str, requests: int, warmup: int, eog: list[int], args: argparse.Namespace
) -> BenchResult:
    config = BenchConfig(
        targets=tuple(ServerTarget(url=url, label=label) for label, url in targets.items()),
        plan=make_plan(levels, None, requests, None, warmup),
        scenario=make_scenario("custom", str(args.input_tokens), str(args.max_tokens)),
        seed=int(time.time()),  # distinct prompts every run: no prefix cache hits across runs
        timeout=900.0,
        extra_body={"temperature": 0.8, "logit_bias": {str(t): -100 for t in eog}},
    )
    result = run_bench_sync(config, Progress())
    log("\n" + format_tables(result))
    return result


def run_of(result: BenchResult, label: str, level: int) -> RunSummary:
    return next(r.summary for r in result.runs if r.summary.label == label and int(r.summary.level) == level)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def scenario_a(model: Path, eog: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """`outpost serve` vs gateway + broker + one worker with the same slots and threads."""
    out: dict[str, Any] = {}
    with ExitStack() as stack:
        broker = stack.enter_context(Broker())
        port = free_port()
        serve = stack.enter_context(
            Process("serve", ["serve", *server_args(model, args.threads, 8), "--port", str(port)])
        )
        serve_url = f"http://127.0.0.1:{port}"
        wait_ready(serve_url, serve.proc)
        w = stack.enter_context(worker(broker, model, args.threads, 8, None))
        gw = stack.enter_context(gateway(broker, model, 1024))
        wait_workers(gw, 1, w)
        result = bench({"serve": serve_url, "gateway": gw}, "1,8", args.requests, args.warmup, eog, args)
    for level in (1, 8):
        direct, via = run_of(result, "serve", level), run_of(result, "gateway", level)
        out[f"streams_{level}"] = {
            "serve_ttft_ms": {"p50": ms(direct.ttft_s.p50), "p99": ms(direct.ttft_s.p99)},
            "gateway_ttft_ms": {"p50": ms(via.ttft_s.p50), "p99": ms(via.ttft_s.p99)},
            "added_ttft_ms": {
                "p50": ms((via.ttft_s.p50 or 0) - (direct.ttft_s.p50 or 0)),
                "p99": ms((via.ttft_s.p99 or 0) - (direct.ttft_s.p99 or 0)),
            },
            "serve_output_tok_s": direct.output_tok_s,
            "gateway_output_tok_s": via.output_tok_s,
            "throughput_ratio": via.output_tok_s / direct.output_tok_s if direct.output_tok_s else None,
            "errors": {"serve": direct.errors, "gateway": via.errors},
        }
    return out


def scenario_b(model: Path, eog: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """1 worker on core 0, then a second one on core 1; 8 streams per worker."""
    with ExitStack() as stack:
        broker = stack.enter_context(Broker())
        w1 = stack.enter_context(worker(broker, model, 1, 8, "0"))
        gw = stack.enter_context(gateway(broker, model, 1024))
        wait_workers(gw, 1, w1)
        one = run_of(bench({"1 worker": gw}, "8", args.requests, args.warmup, eog, args), "1 worker", 8)
        w2 = stack.enter_context(worker(broker, model, 1, 8, "1"))
        wait_workers(gw, 2, w2)
        two = run_of(
            bench({"2 workers": gw}, "16", 2 * args.requests, args.warmup, eog, args), "2 workers", 16
        )
    return {
        "one_worker_output_tok_s": one.output_tok_s,
        "two_workers_output_tok_s": two.output_tok_s,
        "ratio": two.output_tok_s / one.output_tok_s if one.output_tok_s else None,
        "errors": {"one": one.errors, "two": two.errors},
        "note": "each worker on its own core (taskset, -t 1); broker, gateway and load generator share them",
    }


def scenario_e(model: Path, eog: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """A burst of `--burst` requests at 2 workers x 4 slots behind a queue of 256."""
    with ExitStack() as stack:
        broker = stack.enter_context(Broker())
        workers = [
            stack.enter_context(worker(broker, model, 1, 4, str(i % max(1, args.threads)))) for i in range(2)
        ]
        gw = stack.enter_context(gateway(broker, model, 256))
        wait_workers(gw, 2, workers[0])
        run = run_of(bench({"burst": gw}, str(args.burst), args.burst, 0, eog, args), "burst", args.burst)
    return {
        "requests": args.burst,
        "answered_ok": run.requests_ok,
        "errors": run.errors,
        "errors_by_code": run.errors_by_code,
        "duration_s": run.duration_s,
        "ttft_s": run.ttft_s.as_dict(),
    }


SCENARIOS = {"a": scenario_a, "b": scenario_b, "e": scenario_e}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--scenarios", default="a,b,e")
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--requests", type=int, default=32, help="requests per level (b: per worker)")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--input-tokens", type=int, default=120)
    p.add_argument("--burst", type=int, default=200, help="(e): concurrent requests sent at once")
    p.add_argument("--out", type=Path, help="results folder (default bench-results/cluster-<timestamp>)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    model = bench_model(args.shape, args.quant)
    eog = eog_tokens(model)
    results: dict[str, Any] = {"shape": args.shape, "quant": args.quant, "cpus": len(os.sched_getaffinity(0))}
    for name in args.scenarios.split(","):
        log(f"== scenario ({name})")
        results[name] = SCENARIOS[name](model, eog, args)
        log(json.dumps(results[name], indent=2))
    out = args.out or Path("bench-results") / time.strftime("cluster-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    log(f"\nresults in {out}")
    print(json.dumps(results, separators=(",", ":")))


if __name__ == "__main__":
    main()
