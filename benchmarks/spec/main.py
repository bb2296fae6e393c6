"""benchmarks/spec/: speculative decoding, Outpost vs llama-server, side by side in one run.

Arms (see arms.py): Outpost and llama-server, each without speculation and with ngram-simple and
ngram-mod, on the real SmolLM2-135M q4_1; and the draft-model check: target = that model converted
to f16 with Outpost's own `outpost quantize --allow-requantize`, draft = the q4_1 file, with and
without the draft on both servers. Every arm's server runs at once (idle between its turns); a
warm-up pass, then `--rounds` rounds, each running every arm in turn at 1, 4 and 8 streams.
Reported: medians over the rounds of decode tok/s after the first token, acceptance, the share of
1-stream greedy texts identical to the same server's plain arm, ratios against the issue's targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from benchmarks.harness.common import log, probe_kernels, wait_ready
from benchmarks.harness.ports import free_port
from benchmarks.spec.arms import SLOTS, Arm
from benchmarks.spec.measure import PassResult, run_pass
from benchmarks.spec.report import report
from benchmarks.spec.tasks import make_tasks
from outpost.models import outpost_home

REAL_MODEL = Path(os.environ.get("OUTPOST_SPEC_MODEL", "/work/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
BUILD = "/work/shared/tools/build-llama-cpp.sh"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=REAL_MODEL, help="the q4_1 GGUF (target, and the draft)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--streams", default="1,4,8")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=256, help="per request at 1 stream (half at more)")
    p.add_argument("--no-llama-server", action="store_true")
    p.add_argument("--no-draft", action="store_true", help="skip the draft-model check")
    p.add_argument("--only-draft", action="store_true", help="only the draft-model check's arms")
    p.add_argument("--draft-streams", default="1", help="stream counts the draft-model arms run at")
    p.add_argument(
        "--short-warmup", action="store_true", help="warm up with one request per arm, not a whole pass"
    )
    p.add_argument("--out", type=Path, default=Path("bench-results/spec"))
    return p.parse_args(argv)


def llama_server_binary() -> str:
    """The pinned llama.cpp's llama-server, built once (under a lock shared with other builders)."""
    found = Path.home() / ".cache/llama-cpp-baselines/0.3.36/bin/llama-server"
    if found.exists():
        return str(found)
    log("building llama-server (flock /tmp/llama-build.lock) ...")
    out = subprocess.run(
        ["flock", "/tmp/llama-build.lock", BUILD], check=True, capture_output=True, text=True
    )
    return str(Path(out.stdout.strip().splitlines()[-1]) / "llama-server")


def f16_target(model: Path) -> Path:
    """The q4_1 model as f16, converted with Outpost's own tool (once)."""
    out = outpost_home() / "bench" / (model.stem + ".f16.gguf")
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "outpost.cli",
            "quantize",
            "--allow-requantize",
            str(model),
            str(out),
            "f16",
        ]
        log("$ " + " ".join(cmd))
        subprocess.run(cmd, check=True)
    return out


def _arms(args: argparse.Namespace) -> list[Arm]:
    servers = ["outpost"] + ([] if args.no_llama_server else ["llama-server"])
    kinds = () if args.only_draft else ("none", "ngram-simple", "ngram-mod")
    arms = [Arm(s, kind, args.model) for s in servers for kind in kinds]
    if not args.no_draft:
        target = f16_target(args.model)
        arms += [Arm(s, "none", target) for s in servers]
        arms += [Arm(s, "draft", target, args.model) for s in servers]
    return arms


class Servers:
    """Every arm's server, started one after another and stopped together."""

    def __init__(self, arms: list[Arm], args: argparse.Namespace, logs: Path) -> None:
        binary = None if args.no_llama_server else llama_server_binary()
        self.urls: dict[str, str] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.argv: dict[str, list[str]] = {}
        logs.mkdir(parents=True, exist_ok=True)
        for arm in arms:
            port = free_port()
            argv = arm.argv(port, args.threads, binary)
            self.argv[arm.label] = argv
            log_file = (logs / (arm.label.replace(" ", "_").replace("(", "").replace(")", "") + ".log")).open(
                "wb"
            )
            self.procs.append(subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT))
            self.urls[arm.label] = f"http://127.0.0.1:{port}"
            # One at a time: Outpost measures step costs at start (prefill budget, speculation's
            # prices), which servers starting together would measure on a shared, busy CPU.
            try:
                wait_ready(self.urls[arm.label], self.procs[-1], 600)
            except BaseException:
                self.stop()
                raise

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    # A SIGTERM (a timeout) ends the run through `finally`: the servers stop, raw.json is written.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    streams = [int(s) for s in args.streams.split(",")]
    tasks = make_tasks()
    arms = _arms(args)
    args.out.mkdir(parents=True, exist_ok=True)
    kernels = probe_kernels(SLOTS)
    servers = Servers(arms, args, args.out / "logs")
    results: dict[str, dict[int, list[PassResult]]] = {a.label: {n: [] for n in streams} for a in arms}
    try:
        for rnd in range(args.rounds + 1):  # round 0: the warm-up, not counted
            for n in streams:
                order = arms if rnd % 2 else list(reversed(arms))  # interleaved, both directions
                for arm in order:
                    if arm.model != args.model and str(n) not in args.draft_streams.split(","):
                        continue
                    max_tokens = args.max_tokens if n == 1 else args.max_tokens // 2
                    started = time.perf_counter()
                    todo = tasks[:1] if rnd == 0 and args.short_warmup else tasks
                    res = asyncio.run(run_pass(servers.urls[arm.label], todo, n, max_tokens))
                    rate = res.decode_tok_s()
                    log(
                        f"round {rnd} {arm.label:34s} {n} streams: {rate or 0:6.1f} tok/s "
                        f"errors {res.errors} ({time.perf_counter() - started:.0f} s)"
                    )
                    if rnd:
                        results[arm.label][n].append(res)
    finally:
        servers.stop()
        raw = {
            label: {n: [[asdict(r) for r in p.replies] for p in passes] for n, passes in by_n.items()}
            for label, by_n in results.items()
        }
        (args.out / "raw.json").write_text(json.dumps(raw) + "\n")
    document = report(results, arms, tasks, servers.argv, args.out)
    document["kernels"] = kernels
    (args.out / "results.json").write_text(json.dumps(document, indent=2) + "\n")
    log(f"wrote {args.out}/results.json and plots")
    print(json.dumps(document["copy_share"]))
    print(json.dumps(document["targets"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
