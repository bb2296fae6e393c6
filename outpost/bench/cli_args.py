"""`outpost bench`: its flags (`add_bench_parser`) and its handler, which turns them into a
`BenchConfig`, runs it, writes results.json, requests.csv and plots, and prints the summary.

Exit status: 0 done, 2 bad usage (a `BenchUsageError`, a ValueError), 3 a `--fail-on` threshold
crossed, 1 the servers could not be benchmarked (unreachable, rejected every request shape).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

from outpost.bench.config import BenchConfig, BenchUsageError, make_plan, make_scenario, make_targets

EXIT_FAIL_ON = 3


def add_bench_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="load-test any OpenAI-compatible server: latency, throughput, plots")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8080")
    p.add_argument(
        "--compare", action="append", default=[], metavar="URL", help="another server (repeatable)"
    )
    p.add_argument("--model", help="model id to request (default: the first id of each server's /v1/models)")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    p.add_argument("--api-key", help="sent as Authorization: Bearer KEY to every server")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", help="closed loop: concurrent users per level, e.g. 1,4,8 (default 1)")
    load.add_argument("--rate", help="open loop: Poisson arrivals in requests/s per level, e.g. 0.5,1,2")
    load.add_argument(
        "--requests", type=int, help="measured requests per level (default 32 without --duration)"
    )
    load.add_argument("--duration", type=float, help="seconds per level (with --requests: whichever first)")
    load.add_argument("--warmup", type=int, default=2, help="unmeasured requests per level and server (2)")
    load.add_argument(
        "--ramp-up",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="closed loop: start the users one by one over this time, not all at once (0)",
    )
    work = p.add_argument_group("workload")
    work.add_argument("--scenario", default="chat", help="chat, summarize, shared-prefix or custom (chat)")
    work.add_argument("--input-tokens", metavar="MEAN[,STD]", help="prompt tokens (overrides the scenario)")
    work.add_argument("--output-tokens", metavar="MEAN[,STD]", help="output tokens (overrides the scenario)")
    work.add_argument(
        "--prompt-file", type=Path, help="text to cut prompts from (default: random common words)"
    )
    work.add_argument("--seed", type=int, help="prompt and arrival seed (default: a new one each run)")
    out = p.add_argument_group("output")
    out.add_argument("--out", type=Path, help="results folder (default ./bench-results/<timestamp>/)")
    out.add_argument("--fail-on", help='thresholds, e.g. "error_rate>0,ttft_p90>2s": exit 3 when crossed')
    out.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    out.add_argument("--timeout", type=float, default=300.0, help="seconds per request (300)")
    p.set_defaults(handler=cmd_bench)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.prompt_file is not None and not args.prompt_file.is_file():
        raise BenchUsageError(f"--prompt-file {args.prompt_file} is not a file")
    if args.timeout <= 0:
        raise BenchUsageError("--timeout must be positive seconds")
    return BenchConfig(
        targets=make_targets(args.url, args.compare, args.model),
        plan=make_plan(args.concurrency, args.rate, args.requests, args.duration, args.warmup, args.ramp_up),
        scenario=make_scenario(args.scenario, args.input_tokens, args.output_tokens),
        endpoint=args.endpoint,
        api_key=args.api_key,
        seed=args.seed if args.seed is not None else random.SystemRandom().randrange(2**31),
        timeout=args.timeout,
        prompt_file=args.prompt_file,
    )


def out_dir(given: Path | None) -> Path:
    path = given or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BenchUsageError(f"cannot create --out {path}: {exc.strerror}") from None
    return path


def cmd_bench(args: argparse.Namespace) -> int:
    # Imported here: `outpost --help` should not pay for httpx and matplotlib.
    from outpost.bench.failon import check, parse_fail_on
    from outpost.bench.progress import Progress
    from outpost.bench.report import format_tables, summary_line, write_outputs
    from outpost.bench.runner import run_bench_sync

    config = config_from_args(args)
    thresholds = parse_fail_on(args.fail_on) if args.fail_on else []
    out = out_dir(args.out)
    progress = Progress()
    progress.log(
        f"outpost bench: seed {config.seed} (--seed {config.seed} repeats the prompts), results in {out}"
    )
    result = run_bench_sync(config, progress)
    violations = check(thresholds, [r.summary for r in result.runs])
    write_outputs(out, result, config, thresholds, violations, plots=not args.no_plots)
    progress.log("\n" + format_tables(result))
    for v in violations:
        seen = "no successful request" if v.observed is None else f"observed {v.observed:.4g}"
        progress.log(f"fail-on: {v.threshold} crossed at {v.label} {v.level:g} ({seen})")
    progress.log(f"\nwrote {out}/results.json, requests.csv" + ("" if args.no_plots else ", *.png"))
    sys.stdout.write(summary_line(result) + "\n")
    sys.stdout.flush()
    return EXIT_FAIL_ON if violations else 0
