"""Engine benchmark: Outpost's engine vs llama-cpp-python's `Llama` vs llama.cpp's `llama-bench`.

Not a test. Run:  python benchmarks/engine.py [--shapes smollm2-135m,smollm2-1.7b] [--threads 2]
Optional baseline: LLAMA_BENCH=/path/to/llama-bench (../shared/tools/build-llama-cpp.sh builds it).

Per shape (synthetic q4_0 model, written once under $OUTPOST_HOME/bench/), measured in one run with
the same prompt (so the same context depth), threads, n_batch and flash-attention setting:
  - single-stream decode tok/s: Outpost and llama-cpp-python, alternated run by run, medians;
  - llama-bench's decode tok/s at the same depth (null when LLAMA_BENCH is unset);
  - Outpost's aggregate decode tok/s at 1, 2, 4, 8 parallel sequences;
  - Outpost's prefill tok/s;
  - memory-bandwidth utilisation = weight bytes x single-stream tok/s / numpy copy bandwidth.
Progress goes to stderr; the last stdout line is one JSON object keyed by shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import bench_model, llama_bench_layout_args, log, same_weight_layout_for_llama_cpp_python

from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams
from outpost.runtime import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PARALLEL = (1, 2, 4, 8)


def copy_bandwidth_bytes_per_s() -> float:
    """Bytes read + written per second by a numpy copy of a 1 GiB array, best of 5."""
    src = np.ones(1 << 30, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def make_prompt(engine: Engine, n_tokens: int, salt: int = 0) -> list[int]:
    words = "the river carried copper light past quiet markets and old stone harbors".split()
    text = " ".join(words[(i * 7 + salt) % len(words)] for i in range(n_tokens * 2))
    tokens = engine.vocab.tokenize(f"{salt} {text}", add_special=False)
    return list(tokens[:n_tokens])


def outpost_decode(engine: Engine, prompt: list[int], n: int) -> float:
    """Single-stream decode tok/s: tokens after the first, over the time after the first."""
    last = None
    for event in engine.client.generate_sync(GenerateRequest(list(prompt), max_tokens=n, sampling=GREEDY)):
        last = event
    assert last is not None and last.timings is not None
    return (last.timings.predicted_n - 1) / last.timings.predicted_ms * 1000.0


def outpost_parallel(engine: Engine, depth: int, n: int, k: int) -> float:
    """Aggregate decode tok/s of k sequences decoding together (distinct prompts, same depth)."""
    import threading

    rates: list[float] = []

    def one(i: int) -> None:
        last = None
        for event in engine.client.generate_sync(
            GenerateRequest(make_prompt(engine, depth, salt=100 + i), max_tokens=n, sampling=GREEDY)
        ):
            last = event
        assert last is not None and last.timings is not None
        rates.append((last.timings.predicted_n - 1) / last.timings.predicted_ms * 1000.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(rates)


def outpost_prefill(engine: Engine, n_tokens: int) -> float:
    last = None
    for event in engine.client.generate_sync(
        GenerateRequest(make_prompt(engine, n_tokens, salt=999), max_tokens=1, sampling=GREEDY)
    ):
        last = event
    assert last is not None and last.timings is not None
    return last.timings.prompt_per_second


def llama_cpp_python_decode(llm: Any, prompt: list[int], n: int) -> float:
    """The same measurement through llama-cpp-python's high-level generate loop."""
    gen = llm.generate(prompt, temp=0.0, reset=True)
    next(gen)  # the first token comes out of prefill
    t0 = time.perf_counter()
    for _ in range(n - 1):
        next(gen)
    elapsed = time.perf_counter() - t0
    gen.close()
    return (n - 1) / elapsed


def llama_bench_decode(
    binary: str, model: Path, threads: int, depth: int, n: int, fa: str, layout: str
) -> float | None:
    cmd = [binary, "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(n), "-d", str(depth)]
    cmd += ["-fa", fa, *llama_bench_layout_args(layout), "-r", "3", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        log(f"llama-bench failed: {proc.stderr.strip()[-300:]}")
        return None
    return float(json.loads(proc.stdout)[0]["avg_ts"])


class LlamaCppPythonWorker:
    """llama-cpp-python's `Llama` in a process of its own: two threads driving llama.cpp's OpenMP
    kernels in one process throttle each other's spin-waits and would slow both engines down."""

    def __init__(self, model: Path, args: argparse.Namespace, config: EngineConfig) -> None:
        cmd = [
            sys.executable,
            __file__,
            "--baseline-worker",
            str(model),
            "--threads",
            str(args.threads),
            "--flash-attn",
            args.flash_attn,
            "--repack",
            str(int(config.use_extra_bufts)),
            "--ubatch",
            str(config.effective_n_ubatch),
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def decode(self, prompt: list[int], n: int) -> float:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "n": n}) + "\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def baseline_worker(args: argparse.Namespace) -> None:
    """The child side of LlamaCppPythonWorker: one measurement per JSON line on stdin."""
    from llama_cpp import Llama

    same_weight_layout_for_llama_cpp_python(bool(args.repack))
    llm = Llama(
        args.baseline_worker,
        n_ctx=4096,
        n_batch=512,
        n_ubatch=args.ubatch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=args.flash_attn == "on",
        verbose=False,
    )
    for line in sys.stdin:
        job = json.loads(line)
        print(llama_cpp_python_decode(llm, job["prompt"], job["n"]), flush=True)


def run_shape(shape: str, args: argparse.Namespace, copy_bw: float) -> dict[str, Any]:
    model = bench_model(shape, args.quant)

    def config(slots: int) -> EngineConfig:
        # Slots pick the weight layout where AMX tiles fault (outpost/engine/cpu_probe.py): one
        # sequence gets the one-token AMX kernel, eight get the batching-friendly plain layout.
        return EngineConfig(
            model_path=str(model), n_ctx=4096, n_batch=512, n_seq_max=slots, n_threads=args.threads,
            flash_attn=args.flash_attn,
        )  # fmt: skip

    single_config, batched_config = config(1), config(8)
    baseline_proc = LlamaCppPythonWorker(model, args, single_config)
    ours: list[float] = []
    theirs: list[float] = []
    with Engine(single_config, prefix_cache=False) as engine:
        prompt = make_prompt(engine, args.depth)
        for r in range(args.repeats):  # alternate engines run by run
            ours.append(outpost_decode(engine, prompt, args.tokens))
            theirs.append(baseline_proc.decode(prompt, args.tokens))
            log(
                f"  {shape} run {r + 1}: outpost {ours[-1]:.1f} tok/s, "
                f"llama-cpp-python {theirs[-1]:.1f} tok/s"
            )
        baseline_proc.close()
        prefill = statistics.median(outpost_prefill(engine, args.prefill_tokens) for _ in range(args.repeats))
        weight_bytes = engine.model.describe()["size_bytes"]
    with Engine(batched_config, prefix_cache=False) as engine:
        batched = {str(k): outpost_parallel(engine, args.depth, args.tokens, k) for k in PARALLEL}
        log(f"  {shape} batched: {batched}")
    bench = os.environ.get("LLAMA_BENCH")
    llama_bench = (
        llama_bench_decode(
            bench, model, args.threads, args.depth, args.tokens, args.flash_attn, single_config.weight_layout
        )
        if bench
        else None
    )
    single = statistics.median(ours)
    baseline = statistics.median(theirs)
    return {
        "single_tok_s": round(single, 2),
        "llama_cpp_python_single_tok_s": round(baseline, 2),
        "ratio_vs_llama_cpp_python": round(single / baseline, 3),
        "llama_bench_tok_s": None if llama_bench is None else round(llama_bench, 2),
        "ratio_vs_llama_bench": None if llama_bench is None else round(single / llama_bench, 3),
        "batched_tok_s": {k: round(v, 2) for k, v in batched.items()},
        "batched_8_over_single": round(batched["8"] / single, 3),
        "prefill_tok_s": round(prefill, 2),
        "weight_bytes": weight_bytes,
        "bandwidth_utilisation": round(weight_bytes * single / copy_bw, 3),
        "single_weight_layout": single_config.weight_layout,
        "batched_weight_layout": batched_config.weight_layout,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", default="smollm2-135m,smollm2-1.7b")
    parser.add_argument("--quant", default="q4_0")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=128, help="prompt tokens before decoding")
    parser.add_argument("--tokens", type=int, default=64, help="tokens decoded per measurement")
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flash-attn", choices=["on", "off"], default="off")
    parser.add_argument("--baseline-worker", help=argparse.SUPPRESS)
    parser.add_argument("--repack", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--ubatch", type=int, default=512, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_worker:
        baseline_worker(args)
        return
    copy_bw = copy_bandwidth_bytes_per_s()
    log(f"numpy copy bandwidth: {copy_bw / 1e9:.2f} GB/s (read + write)")
    results: dict[str, Any] = {}
    for shape in args.shapes.split(","):
        log(f"benchmarking {shape} ...")
        results[shape] = run_shape(shape, args, copy_bw)
    results["copy_bandwidth_gb_s"] = round(copy_bw / 1e9, 2)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
