"""Server benchmark: `outpost serve` vs llama-cpp-python's server vs llama.cpp's `llama-server`.

Measured by `outpost bench` underneath (outpost.bench's runner API), so both report alike.

Not a test. Run:  python benchmarks/serve.py [--shape smollm2-135m] [--threads 2] [--requests 32]
Optional baseline: LLAMA_SERVER=/path/to/llama-server (../shared/tools/build-llama-cpp.sh builds it).
llama-cpp-python's server needs its extras: pip install -e ".[bench]".

Same synthetic GGUF (q4_0, written once under $OUTPOST_HOME/bench/), same threads, every server on
its own free loopback port, all started first (idle servers cost memory, not CPU), then `outpost
bench --compare`: at 1, 4 and 8 concurrent streams, `--warmup` then `--requests` requests on each
server in turn (A B C A B C ...). The chat workload: distinct prompts of exactly `--input-tokens`
tokens (Outpost's /tokenize; the chat template adds ~10), `--max-tokens` output tokens with EOS
banned (ignore_eos and a logit_bias on every end-of-generation token), streamed. Per level: output
tokens/s, TTFT, ITL, TPOT and e2e percentiles, errors by code (a stream cut off before max_tokens is
`short_output`). Tables to stderr; results.json, requests.csv and PNGs in --out; the last stdout line
is `outpost bench`'s summary: {"runs": [{"url", "concurrency", "output_tok_s", "ttft_s", ...}, ...]}.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from common import (
    bench_model,
    free_port,
    llama_server_layout_args,
    log,
    same_weight_layout_for_llama_cpp_python,
    wait_ready,
    weight_layout,
)

from outpost.bench.config import BenchConfig, ServerTarget, make_plan, make_scenario
from outpost.bench.progress import Progress
from outpost.bench.report import format_tables, summary_line, write_outputs
from outpost.bench.runner import run_bench_sync
from outpost.engine.config import EngineConfig, available_cpus

LCP_WORKER = "--llama-cpp-python-server"


def eog_tokens(model: Path) -> list[int]:
    """Every end-of-generation id: the workload bans them all so each stream runs to max_tokens."""
    from outpost.engine.model import LoadedModel

    loaded = LoadedModel(EngineConfig(model_path=str(model), n_ctx=256, n_seq_max=1))
    try:
        return sorted(loaded.vocab.eog_ids)
    finally:
        loaded.close()


def server_command(kind: str, model: Path, threads: int, port: int, parallel: int) -> list[str]:
    """The same GGUF, threads and weight layout for every server; outpost and llama-server get the
    same slots and KV cells."""
    m, t, p, ctx = str(model), str(threads), str(port), str(1024 * parallel)
    if kind == "outpost":
        opts = f"serve -m {m} -t {t} -np {parallel} -c {ctx} --port {p}"
        return [sys.executable, "-m", "outpost.cli", *opts.split()]
    if kind == "llama_cpp_python":
        opts = f"--model {m} --n_threads {t} --n_threads_batch {t} --n_ctx 2048 --host 127.0.0.1 --port {p}"
        return [sys.executable, __file__, LCP_WORKER, *opts.split(), "--verbose", "False"]
    layout = llama_server_layout_args(weight_layout(model, parallel))
    opts = f"-m {m} -t {t} -tb {t} -np {parallel} -c {ctx} --host 127.0.0.1 --port {p}"
    return [os.environ["LLAMA_SERVER"], *opts.split(), *layout]


class ServerProcess:
    """One server under test on a free port; stopped (SIGTERM, then kill) on exit."""

    def __init__(self, kind: str, model: Path, args: argparse.Namespace) -> None:
        self.kind = kind
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in __exit__)
        cmd = server_command(kind, model, args.threads, port, args.parallel)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._err)

    def __enter__(self) -> ServerProcess:
        wait_ready(self.url, self.proc)
        log(f"[{self.kind}] ready on {self.url}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._err.close()


def bench_config(urls: dict[str, str], eog: list[int], args: argparse.Namespace) -> BenchConfig:
    """Outpost first: its /tokenize sizes the prompts every server gets, and ratios are against it."""
    targets = tuple(ServerTarget(url=url, label=kind) for kind, url in urls.items())
    extra = {"temperature": 0.8, "logit_bias": {str(t): -100 for t in eog}}
    return BenchConfig(
        targets=targets,
        plan=make_plan(args.levels, None, args.requests, None, args.warmup),
        scenario=make_scenario("custom", str(args.input_tokens), str(args.max_tokens)),
        seed=args.seed if args.seed is not None else int(time.time()),  # distinct prompts every run
        timeout=600.0,
        extra_body=extra,
    )


def have_llama_cpp_server() -> bool:
    try:
        import llama_cpp.server.app  # noqa: F401
    except ImportError as exc:
        log(f"llama-cpp-python's server is not installed ({exc}); pip install -e '.[bench]' to include it")
        return False
    return True


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--threads", type=int, default=available_cpus())
    p.add_argument("--parallel", type=int, default=8, help="slots for outpost and llama-server")
    p.add_argument("--requests", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--warmup", type=int, default=4, help="unmeasured requests per level and server")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--input-tokens", type=int, default=120, help="user-message tokens (~130 with the template)"
    )
    p.add_argument("--levels", default="1,4,8")
    p.add_argument("--servers", default="outpost,llama_cpp_python,llama_server")
    p.add_argument("--seed", type=int, help="prompt seed (default: the clock, so prompts differ every run)")
    p.add_argument("--out", type=Path, help="results folder (default bench-results/serve-<timestamp>)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    model = bench_model(args.shape, args.quant)
    kinds = [
        kind
        for kind in args.servers.split(",")
        if not (kind == "llama_server" and not os.environ.get("LLAMA_SERVER"))
        and not (kind == "llama_cpp_python" and not have_llama_cpp_server())
    ]
    kinds.sort(key=lambda k: k != "outpost")
    eog = eog_tokens(model)
    with ExitStack() as stack:
        servers = [stack.enter_context(ServerProcess(kind, model, args)) for kind in kinds]
        config = bench_config({s.kind: s.url for s in servers}, eog, args)
        result = run_bench_sync(config, Progress())
    out = args.out or Path("bench-results") / time.strftime("serve-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, result, config, thresholds=[], violations=[])
    log("\n" + format_tables(result))
    log(f"\nresults in {out}")
    print(summary_line(result))


def run_llama_cpp_python_server(argv: list[str]) -> None:
    """`python -m llama_cpp.server ARGV` with the weight layout Outpost picks for several slots
    (outpost/engine/cpu_probe.py). Not the one-token AMX layout, though it serves one request at a
    time: it loads the model on one thread and decodes on another, and on this VM that makes
    OpenMP decode ~3x slower after AMX repacking (13 vs 39 tok/s measured)."""
    import runpy

    config = EngineConfig(model_path=argv[argv.index("--model") + 1], n_seq_max=4)
    same_weight_layout_for_llama_cpp_python(config)
    sys.argv = ["llama_cpp.server", *argv, "--n_ubatch", str(config.effective_n_ubatch)]
    runpy.run_module("llama_cpp.server", run_name="__main__")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == LCP_WORKER:
        run_llama_cpp_python_server(sys.argv[2:])
    else:
        main()
