"""Server benchmark: `outpost serve` vs llama.cpp's `llama-server` vs llama-cpp-python's server.

Not a test. Run (llama-server from ../shared/tools/build-llama-cpp.sh, which prints its bin folder last):
    LLAMA_SERVER=$(bash ../shared/tools/build-llama-cpp.sh | tail -1)/llama-server \\
        taskset -c 0 python -m benchmarks.serve --cpus 1 [--levels 1,4,8,16] [--rounds 3]
    python -m benchmarks.serve --levels 1,4 --rounds 1 --requests 4 --scenarios throughput   # a quick look
llama-cpp-python's server needs its extras (pip install -e ".[bench]"); --no-llama-cpp-python skips it.
`--cpus` pins the servers (`taskset -c`, and `-t` = that many threads); run this script itself off
those CPUs (`taskset -c OTHER python ...`) so the load generator does not take the servers' cores.

Same synthetic GGUF (q4_0, written once under $OUTPOST_HOME/bench/), same threads, `-np` and `-c`
for every server, each with the weight layout its users get on this host (llama-server: see
servers.py; the exact command lines are printed and recorded). Load by `outpost bench`'s runner.

throughput: all servers started once and kept up; for each of `--rounds` rounds, for each level of
    `--levels` concurrent streams, every server in turn, the order rotated every round so no server
    always goes first: warmup requests, then measured ones. The chat workload: distinct prompts of
    exactly `--input-tokens` tokens (Outpost's /tokenize; the chat template adds ~10), `--max-tokens`
    output tokens with EOS banned, streamed. Per server and level, the median over rounds of output
    tok/s, TTFT p50/p90 and ITL p50/p90, errors summed; Outpost / llama-server ratios with the targets.
    `--lengths chat` draws each request's lengths instead (50-150 tokens in, 100-300 out, uniform;
    the same draws for every server): streams then finish apart, as real users' do, where with
    fixed lengths a closed loop's streams start and finish in waves.
    llama-cpp-python's server serves one request at a time and cuts the others' streams: it runs at
    `--llama-cpp-python-levels` only (default 1,4).
shared-prefix: `outpost bench`'s shared-prefix scenario (one ~500-token system prompt, 20-60-token user
    turns, 50-150 output tokens) at `--prefix-streams` streams on a freshly started server: cold (its
    first `--prefix-requests` requests), then warm (after `--prefix-warmup` requests with the same
    prefix). llama-server runs with its prompt cache as its users set it (`--cache-reuse 256`,
    requests with `cache_prompt: true`). TTFT p50/p90 and prompt tokens evaluated / reused per
    request (the servers' `timings.prompt_n` / `cache_n`), medians over rounds.
models: (benchmarks/serve/models.py) two GGUFs (`--pair`): cold vs warm TTFT on one `outpost serve
    --models-dir` over both (load included, and the load alone), then `--models-levels` streams split
    over the two models against that Outpost and against two llama-servers (one per model), the same
    -t per model in both setups, rounds rotated.

Writes --out (default bench-results/serve-<timestamp>/): results.json, requests.csv, throughput.png,
ttft.png, shared_prefix.png, models.png, logs/ (every server's output). Markdown tables go to stderr (for
docs/performance.md); the last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.harness.common import bench_model, log, probe_kernels
from benchmarks.harness.servers import KINDS, LABELS, ServerProcess, Setup, eog_tokens
from benchmarks.serve.models_report import ModelsReport
from benchmarks.serve.report import Report
from benchmarks.serve.scenarios import run_shared_prefix, throughput_rounds
from benchmarks.serve.tables import markdown_tables
from outpost.engine.config import available_cpus


def cpu_count(cpus: str) -> int:
    """How many CPUs a `taskset -c` list names ("1", "0-3,6")."""
    total = 0
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        total += int(hi or lo) - int(lo) + 1
    return total


def start_servers(
    stack: ExitStack, kinds: list[str], setup: Setup, logs: Path, failed: dict[str, str]
) -> dict[str, ServerProcess]:
    """Every server up at once (idle servers cost memory, not CPU); a baseline that fails to start
    is left out and said so, Outpost failing stops the run."""
    procs = {}
    for kind in kinds:
        try:
            procs[kind] = stack.enter_context(ServerProcess.start(kind, setup, logs / f"{LABELS[kind]}.log"))
        except (RuntimeError, TimeoutError) as exc:
            if kind == "outpost":
                raise
            failed[LABELS[kind]] = str(exc)
    return procs


def run_throughput(
    kinds: list[str], setup: Setup, args: argparse.Namespace, extra: dict[str, Any], report: Report
) -> None:
    with ExitStack() as stack:
        procs = start_servers(stack, kinds, setup, args.out / "logs", report.failed)
        report.servers.update({p.spec.label: p.spec.describe() for p in procs.values()})
        runs, note = asyncio.run(throughput_rounds(procs, args, extra))
    report.level_runs.extend(runs)
    report.notes.append(f"throughput prompts: {note}")


def model_pair(args: argparse.Namespace) -> dict[str, Path]:
    """The models scenario's two GGUFs by name (the file stems, as --models-dir names them)."""
    if args.pair:
        paths = [Path(p.strip()).expanduser() for p in args.pair.split(",") if p.strip()]
    else:
        paths = [bench_model(args.shape, "q4_0"), bench_model(args.shape, "q8_0")]
    pair = {p.stem: p for p in paths}
    if len(paths) != 2 or len(pair) != 2 or not all(p.is_file() for p in paths):
        raise SystemExit(f"--pair takes two GGUF files of different names, got {args.pair!r}")
    return pair


def run_models_scenario(setup: Setup, args: argparse.Namespace, report: Report) -> None:
    from benchmarks.serve.models import run_models

    pair = model_pair(args)
    threads = f"-t {setup.threads} per model in both setups ({2 * setup.threads} threads when both decode)"
    threads += f", -fa {args.models_fa}" if args.models_fa != "auto" else ", each its own -fa default"
    pin = f", every process pinned to CPUs {setup.cpus}" if setup.cpus else ", not pinned"
    models = {name: f"{path}, {path.stat().st_size / 2**20:.0f} MiB" for name, path in pair.items()}
    report.models = ModelsReport(models, threads + pin)
    run_models(pair, setup, args, report.models)


def have_llama_cpp_server() -> bool:
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError as exc:
        log(f"llama-cpp-python's server is not installed ({exc}); pip install -e '.[bench]' to include it")
        return False
    return True


def pick_kinds(args: argparse.Namespace) -> list[str]:
    kinds = [k.strip() for k in args.servers.split(",") if k.strip()]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise SystemExit(f"unknown --servers {sorted(unknown)}; choose from {', '.join(KINDS)}")
    if "llama_server" in kinds and not args.llama_server:
        log("LLAMA_SERVER is not set: llama-server left out (../shared/tools/build-llama-cpp.sh builds it)")
        kinds.remove("llama_server")
    if "llama_cpp_python" in kinds and (args.no_llama_cpp_python or not have_llama_cpp_server()):
        kinds.remove("llama_cpp_python")
    return sorted(kinds, key=KINDS.index)  # Outpost first: its /tokenize sizes the prompts


def int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add = p.add_argument
    add("--shape", default="smollm2-135m")
    add("--quant", default="q4_0")
    add("--model", type=Path, help="a GGUF to serve instead of the synthetic --shape/--quant one")
    add("--ngl", type=int, default=0, help="-ngl for outpost and llama-server (e.g. 99: every layer)")
    add("--cpus", help="pin every server to these CPUs (taskset -c LIST); -t defaults to their count")
    add("--threads", type=int, help="-t for every server (default: --cpus' count, else usable CPUs)")
    add("--parallel", type=int, default=8, help="-np for outpost and llama-server (-c is 1024 x np)")
    add("--levels", type=int_list, default=[1, 4, 8, 16], help="concurrent streams (default 1,4,8,16)")
    add("--rounds", type=int, default=3, help="rounds; medians over them are reported")
    add("--requests", type=int, help="measured requests per level (default 4 per stream, at least 16)")
    add("--warmup", type=int, help="unmeasured requests per level and server (default: streams, >= 4)")
    add("--max-tokens", type=int, default=128)
    add("--input-tokens", type=int, default=120, help="user-message tokens (~130 with the template)")
    add(
        "--lengths",
        choices=["fixed", "chat"],
        default="fixed",
        help="throughput workload: fixed (--input-tokens in, --max-tokens out, every request alike) "
        "or chat (outpost bench's chat scenario: 50-150 tokens in, 100-300 out, uniform)",
    )
    add("--servers", default=",".join(KINDS))
    add("--no-llama-cpp-python", action="store_true", help="leave llama-cpp-python's server out")
    add("--llama-cpp-python-levels", type=int_list, default=[1, 4], help="where it runs (default 1,4)")
    add("--scenarios", default="throughput,shared-prefix", help="throughput, shared-prefix, models")
    add("--pair", help="models scenario: two GGUFs, A,B (default: the synthetic --shape in q4_0 and q8_0)")
    add("--models-levels", type=int_list, default=[2, 4], help="models scenario: total streams (2,4)")
    add(
        "--models-fa",
        choices=["on", "off", "auto"],
        default="on",
        help="models scenario: -fa for every process alike (auto: each its own default)",
    )
    add("--prefix-streams", type=int, default=8)
    add("--prefix-requests", type=int, default=16, help="measured requests, cold and warm each")
    add("--prefix-warmup", type=int, default=8, help="requests between cold and warm")
    add("--timeout", type=float, default=300.0, help="seconds per request")
    add("--level-time", type=float, default=900.0, help="no request of a level starts after this (s)")
    add("--seed", type=int, help="prompt seed (default: the clock, so prompts differ every run)")
    add("--out", type=Path, help="results folder (default bench-results/serve-<timestamp>)")
    args = p.parse_args()
    args.seed = args.seed if args.seed is not None else int(time.time())
    args.threads = args.threads or (cpu_count(args.cpus) if args.cpus else available_cpus())
    args.out = args.out or Path("bench-results") / time.strftime("serve-%Y%m%d-%H%M%S")
    args.llama_server = os.environ.get("LLAMA_SERVER")
    if args.rounds < 1 or not args.levels or min(args.levels) < 1:
        p.error("--rounds and --levels must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    scenarios = {s.strip() for s in args.scenarios.split(",")}
    if not scenarios <= {"throughput", "shared-prefix", "models"}:
        raise SystemExit(f"--scenarios takes throughput, shared-prefix and/or models, got {args.scenarios!r}")
    model = args.model or bench_model(args.shape, args.quant)
    setup = Setup(model, args.threads, args.parallel, args.cpus, args.llama_server, args.ngl)
    kinds = pick_kinds(args)
    args.out.mkdir(parents=True, exist_ok=True)
    extra = {"temperature": 0.8, "logit_bias": {str(t): -100 for t in eog_tokens(model)}}
    report = Report(args, setup)
    log(report.plan_text(kinds))
    if "outpost" in kinds and args.ngl == 0:
        report.notes.append(probe_kernels(args.parallel))
    try:
        if "throughput" in scenarios:
            run_throughput(kinds, setup, args, extra, report)
        if "shared-prefix" in scenarios:
            if "llama_cpp_python" in kinds:
                report.notes.append(
                    "llama-cpp-python's server is not in the shared-prefix scenario: it serves "
                    "one request at a time and would cut the other streams"
                )
            prefix_kinds = [k for k in kinds if k != "llama_cpp_python" and LABELS[k] not in report.failed]
            run_shared_prefix(prefix_kinds, setup, args, extra, report)
        if "models" in scenarios:
            run_models_scenario(setup, args, report)
    finally:  # interrupted or failed: what was measured so far is still written
        report.write(args.out)
        from benchmarks.serve.plots import write_plots  # matplotlib is slow to import: only at the end

        write_plots(report, args.out)
        log("\n" + markdown_tables(report))
        log(f"\nresults in {args.out}")
    print(json.dumps(report.summary(), separators=(",", ":")))
