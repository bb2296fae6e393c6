"""Engine benchmark: Outpost's engine vs llama-cpp-python's `Llama` vs llama.cpp's `llama-bench`.

Not a test. Run:  python -m benchmarks.engine [--shapes smollm2-135m,smollm2-1.7b] [--threads 2]
                  [--repeats 5] [--single-repeats 15]
Optional baselines: LLAMA_BENCH=/path/to/llama-bench, LLAMA_BATCHED_BENCH=/path/to/llama-batched-bench
(../shared/tools/build-llama-cpp.sh builds both).

Per shape (synthetic q4_0 model, written once under $OUTPOST_HOME/bench/), measured in one run with
the same prompt (so the same context depth), threads, n_batch and flash-attention setting:
  - single-stream decode tok/s: Outpost, llama-cpp-python and llama-bench (when LLAMA_BENCH is
    set; null otherwise), alternated run by run, medians, all with llama-bench's own KV size
    (depth + tokens), and Outpost's again with a server's 4096 KV cells;
  - Outpost's steady-state aggregate decode tok/s at 1, 2, 4, 8 parallel sequences (8 slots), each
    round beside the 1-slot single stream it is divided by, on one slot of as many KV cells as each
    of the 8 has (`batched_8_over_single`: the median of the rounds' ratios; the single stream on
    llama-bench's KV size too, `batched_8_over_single_kv{depth+tokens}`), and
    llama-batched-bench's (when set; it cannot name CPU_REPACK alone, so where AMX tiles fault it
    runs the plain layout, the best llama.cpp's tools offer there);
  - Outpost's prefill tok/s with 1 slot and with 8 (their weight layouts differ on AMX CPUs);
  - memory-bandwidth utilisation = weight bytes x single-stream tok/s / numpy copy bandwidth.
Each engine runs the way its users run it: Outpost's engine on huge pages (it re-executes itself with
glibc's hugetlb tunable, as `outpost run` and `outpost serve` do; outpost/engine/hugepages.py), the
baselines on plain pages unless --baseline-hugepages gives them the same tunable.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.engine.ratios import medians, ratios_to_single, rounded
from benchmarks.harness.common import (
    baseline_layout,
    bench_model,
    llama_bench_layout_args,
    log,
    same_weight_layout_for_llama_cpp_python,
)
from outpost.engine.config import EngineConfig, with_probed_kernels
from outpost.engine.hugepages import environ_without_hugepages, hugepages_enabled, reexec_with_hugepages
from outpost.messages import GenerateRequest, SamplingParams
from outpost.serving.assembly import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PARALLEL = (1, 2, 4, 8)
SINGLE_PER_ROUND = 5  # the 1-slot single stream's runs in each batched round (a median)
# The KV size a server runs with. Without flash attention llama.cpp stores V transposed, one row
# per KV cell capacity, so decode at the same depth is slower with more cells (135M: ~12% from 256
# to 4096 cells); the side-by-side runs use llama-bench's own size, and this one is reported too.
SERVING_KV_CELLS = 4096
# 8 slots, each with a stream of 1024 cells (room for the prefill prompt) where KV is per slot.
BATCHED_KV_CELLS = 8192
BATCHED_SLOTS = 8
# The single stream the 8 sequences are divided by runs on one slot of the same size as each of
# theirs: with V stored transposed, a stream's capacity, not only its depth, sets its decode speed
# (llama-batched-bench, 8 sequences at depth 128-192: 478-494 tok/s on 256-cell streams, 440-450 on
# 1024-cell ones, Intel Xeon model 167; docs/performance.md), so smaller cells on one side would not
# measure batching alone.
CELLS_PER_SLOT = BATCHED_KV_CELLS // BATCHED_SLOTS


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
    """Steady-state aggregate decode tok/s of k sequences (distinct prompts, same depth), as
    llama-batched-bench reports it: tokens produced while all k decode together, over that window.

    Summing per-request rates instead would charge each request for the others' prefill, which
    chunked prefill interleaves with the first requests' decode steps."""
    import threading

    arrivals: list[list[float]] = [[] for _ in range(k)]

    def one(i: int) -> None:
        request = GenerateRequest(make_prompt(engine, depth, salt=100 + i), max_tokens=n, sampling=GREEDY)
        for event in engine.client.generate_sync(request):
            arrivals[i].extend([time.perf_counter()] * len(event.token_ids))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    start = max(times[0] for times in arrivals)  # the last sequence's first token: all decode now
    end = min(times[-1] for times in arrivals)  # the first sequence to finish
    produced = sum(1 for times in arrivals for t in times if start < t <= end)
    if end <= start or produced == 0:
        raise RuntimeError(f"{k} sequences never decoded together; raise --tokens")
    return produced / (end - start)


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
    binary: str, model: Path, threads: int, depth: int, n: int, fa: str, layout: str, env: dict[str, str]
) -> float | None:
    cmd = [binary, "-m", str(model), "-t", str(threads), "-p", "0", "-n", str(n), "-d", str(depth)]
    cmd += ["-fa", fa, *llama_bench_layout_args(baseline_layout(layout, binary)), "-r", "1", "-o", "json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        log(f"llama-bench failed: {proc.stderr.strip()[-300:]}")
        return None
    return float(json.loads(proc.stdout)[0]["avg_ts"])


def llama_batched_bench(
    binary: str,
    model: Path,
    threads: int,
    depth: int,
    n: int,
    fa: str,
    layout: str,
    env: dict[str, str],
    unified: bool = False,
    widths: tuple[int, ...] = PARALLEL,
) -> dict[str, float] | None:
    """llama.cpp's own aggregate decode tok/s at `widths` sequences (its S_TG), same depth; a KV
    stream per sequence (its default) or one pool (-kvu), as Outpost's run it is compared with."""
    cells = max(BATCHED_KV_CELLS, 1024 * max(widths))
    cmd = [binary, "-m", str(model), "-t", str(threads), "-tb", str(threads), "-c", str(cells)]
    npl = ",".join(str(w) for w in widths)
    cmd += ["-b", "512", "-ub", "512", "-npp", str(depth), "-ntg", str(n), "-npl", npl, "-fa", fa]
    repack = baseline_layout(layout, binary) == "repacked"
    cmd += ["--repack" if repack else "--no-repack", "--output-format", "jsonl"]
    cmd += ["-kvu"] if unified else []
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        log(f"llama-batched-bench failed: {proc.stderr.strip()[-300:]}")
        return None
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {str(row["pl"]): round(float(row["speed_tg"]), 2) for row in rows}


class LlamaCppPythonWorker:
    """llama-cpp-python's `Llama` in a process of its own: two threads driving llama.cpp's OpenMP
    kernels in one process throttle each other's spin-waits and would slow both engines down."""

    def __init__(self, model: Path, args: argparse.Namespace, config: EngineConfig) -> None:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.engine",
            "--baseline-worker",
            str(model),
            "--threads",
            str(args.threads),
            "--flash-attn",
            args.flash_attn,
            "--slots",
            str(config.n_seq_max),
            "--n-ctx",
            str(config.n_ctx),
        ]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=args.baseline_env
        )

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

    config = EngineConfig(model_path=args.baseline_worker, n_seq_max=args.slots)
    same_weight_layout_for_llama_cpp_python(config)
    llm = Llama(
        args.baseline_worker,
        n_ctx=args.n_ctx,
        n_batch=512,
        n_ubatch=config.effective_n_ubatch,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        flash_attn=args.flash_attn == "on",
        verbose=False,
    )
    for line in sys.stdin:
        job = json.loads(line)
        print(llama_cpp_python_decode(llm, job["prompt"], job["n"]), flush=True)


def median_of(repeats: int, measure: Callable[[], float]) -> float:
    return statistics.median(measure() for _ in range(repeats))


def run_shape(shape: str, args: argparse.Namespace, copy_bw: float) -> dict[str, Any]:
    model = bench_model(shape, args.quant)
    kv_cells = args.depth + args.tokens  # llama-bench's own KV size (prompt + gen + depth)

    def config(slots: int, n_ctx: int) -> EngineConfig:
        # Slots pick the weight layout where AMX tiles fault (outpost/engine/cpu_probe.py): one
        # sequence gets the one-token AMX kernel, eight the repacked layout without AMX.
        return EngineConfig(
            model_path=str(model), n_ctx=n_ctx, n_batch=512, n_seq_max=slots, n_threads=args.threads,
            flash_attn=args.flash_attn,
        )  # fmt: skip

    # The engine as users run it (`auto`: the kernel probe's choice on this machine); every other
    # run, ours and the baselines', gets the flash attention it resolved to.
    batched_config, kernels = with_probed_kernels(config(BATCHED_SLOTS, BATCHED_KV_CELLS))
    args = argparse.Namespace(**{**vars(args), "flash_attn": batched_config.effective_flash_attn})
    log(f"  {shape}: kernels {kernels.describe() if kernels else 'as asked'}")
    single_config = config(1, kv_cells)
    singles = {"same_cells": config(1, CELLS_PER_SLOT), f"kv{kv_cells}": single_config}
    if args.batched_only:
        batched = batched_side_by_side(shape, model, args, batched_config, singles)
        single = batched[f"single_tok_s_in_rounds_kv{kv_cells}"]
        return {"single_tok_s": single, "kernels": kernels.describe() if kernels else None, **batched}
    ours, theirs, bench_runs = single_stream_side_by_side(shape, model, args, single_config)
    with Engine(config(1, SERVING_KV_CELLS), prefix_cache=False) as engine:
        prompt = make_prompt(engine, args.depth)
        ours_big_kv = median_of(args.repeats, lambda: outpost_decode(engine, prompt, args.tokens))
        prefill = median_of(args.repeats, lambda: outpost_prefill(engine, args.prefill_tokens))
        weight_bytes = engine.model.describe()["size_bytes"]
    batched = batched_side_by_side(shape, model, args, batched_config, singles)
    llama_bench = statistics.median(bench_runs) if bench_runs else None
    single = statistics.median(ours)
    baseline = statistics.median(theirs)
    return {
        "single_tok_s": round(single, 2),
        "llama_cpp_python_single_tok_s": round(baseline, 2),
        "ratio_vs_llama_cpp_python": round(single / baseline, 3),
        "llama_bench_tok_s": None if llama_bench is None else round(llama_bench, 2),
        "ratio_vs_llama_bench": None if llama_bench is None else round(single / llama_bench, 3),
        "kv_cells": kv_cells,
        f"single_tok_s_kv{SERVING_KV_CELLS}": round(ours_big_kv, 2),
        "kernels": kernels.describe() if kernels else None,
        **batched,
        "prefill_tok_s": round(prefill, 2),
        "weight_bytes": weight_bytes,
        "bandwidth_utilisation": round(weight_bytes * single / copy_bw, 3),
        "single_weight_layout": single_config.weight_layout,
        "batched_weight_layout": batched_config.weight_layout,
    }


def single_stream(args: argparse.Namespace, config: EngineConfig) -> float:
    """A 1-slot engine's single-stream decode tok/s, the median of SINGLE_PER_ROUND runs."""
    with Engine(config, prefix_cache=False) as engine:
        prompt = make_prompt(engine, args.depth)
        return median_of(SINGLE_PER_ROUND, lambda: outpost_decode(engine, prompt, args.tokens))


def outpost_round(
    args: argparse.Namespace, config: EngineConfig, singles: dict[str, EngineConfig]
) -> tuple[dict[str, float], dict[str, float], bool]:
    """One round of Outpost's side: each 1-slot engine's single stream (median of SINGLE_PER_ROUND
    runs), then aggregate decode at each of PARALLEL sequences on the 8-slot engine; and whether
    that engine's KV is one pool. One engine at a time: two OpenMP teams in one process throttle
    each other's spin-waits."""
    single = {name: single_stream(args, single_config) for name, single_config in singles.items()}
    with Engine(config, prefix_cache=False) as engine:
        rates = {str(k): outpost_parallel(engine, args.depth, args.tokens, k) for k in PARALLEL}
        return single, rates, engine.model.kv_unified


def batched_side_by_side(
    shape: str, model: Path, args: argparse.Namespace, config: EngineConfig, singles: dict[str, EngineConfig]
) -> dict[str, Any]:
    """Aggregate decode at 1, 2, 4, 8 sequences as users run the engine (its `auto` kernels: the
    kernel probe's choice here), and llama-batched-bench with the same flash attention, KV layout
    (-kvu where Outpost runs one pool) and KV size, round by round in turn (--batched-rounds;
    medians: this machine is shared); then once with the other KV layout, and prefill with 8 slots.
    Each Outpost round also times the 1-slot single streams the 8 sequences are divided by, so that
    the ratio compares runs minutes apart at most (this VM's speed has moved 1.8x within one run)."""
    binary = os.environ.get("LLAMA_BATCHED_BENCH")
    fa = config.effective_flash_attn
    ours: list[dict[str, float]] = []
    single_rounds: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    results: dict[str, Any] = {}
    unified = False  # round 1 runs Outpost first, which tells
    for r in range(args.batched_rounds):
        for side in ("outpost", "llama") if r % 2 == 0 else ("llama", "outpost"):
            if side == "outpost":
                single, rates, unified = outpost_round(args, config, singles)
                single_rounds.append(single)
                ours.append(rates)
                log(f"  {shape} round {r + 1} outpost: 1 slot {rounded(single)}, 8 slots {rounded(rates)}")
            elif binary:
                got = llama_batched_bench(
                    binary, model, args.threads, args.depth, args.tokens, fa, config.weight_layout,
                    args.baseline_env, unified,
                )  # fmt: skip
                if got is not None:
                    theirs.append(got)
                    log(f"  {shape} round {r + 1} llama-batched-bench: {got}")
    with Engine(config, prefix_cache=False) as engine:
        prefill = median_of(args.repeats, lambda: outpost_prefill(engine, args.prefill_tokens))
        results["prefill_tok_s_8_slots"] = round(prefill, 2)
    results.update(ratios_to_single(ours, single_rounds))
    other = "off" if unified else "on"
    with Engine(config.model_copy(update={"kv_unified": other}), prefix_cache=False) as engine:
        rates = {str(k): round(outpost_parallel(engine, args.depth, args.tokens, k), 2) for k in PARALLEL}
    log(f"  {shape} the other KV layout (-kvu {other}): {rates}")
    results["batched_tok_s"] = medians(ours)
    results["batched_tok_s_rounds"] = [rounded(r) for r in ours]
    results["batched_kv_unified"] = unified
    results["batched_flash_attn"] = fa
    results["batched_tok_s_kv_pool" if other == "on" else "batched_tok_s_kv_per_slot"] = rates
    results["batched_8_over_1"] = round(results["batched_tok_s"]["8"] / results["batched_tok_s"]["1"], 3)
    results["llama_batched_bench_tok_s"] = medians(theirs) if theirs else None
    results["llama_batched_bench_rounds"] = theirs
    if theirs:
        results["batched_8_vs_llama_batched_bench"] = round(
            results["batched_tok_s"]["8"] / results["llama_batched_bench_tok_s"]["8"], 3
        )
    return results


def single_stream_side_by_side(
    shape: str, model: Path, args: argparse.Namespace, config: EngineConfig
) -> tuple[list[float], list[float], list[float]]:
    """Outpost, llama-cpp-python's `Llama` and llama-bench, same depth and KV size, run by run in
    a rotating order: this machine's speed drifts by ~10% over minutes, and a run right after
    llama-bench (which loads and frees the whole model) is slower, so no engine always goes first."""
    bench = os.environ.get("LLAMA_BENCH")
    baseline_proc = LlamaCppPythonWorker(model, args, config)
    rates: dict[str, list[float]] = {"outpost": [], "llama-cpp-python": [], "llama-bench": []}
    with Engine(config, prefix_cache=False) as engine:
        prompt = make_prompt(engine, args.depth)
        measures: dict[str, Callable[[], float | None]] = {
            "outpost": lambda: outpost_decode(engine, prompt, args.tokens),
            "llama-cpp-python": lambda: baseline_proc.decode(prompt, args.tokens),
        }
        if bench:
            measures["llama-bench"] = lambda: llama_bench_decode(
                bench, model, args.threads, args.depth, args.tokens, args.flash_attn, config.weight_layout,
                args.baseline_env,
            )  # fmt: skip
        names = list(measures)
        for r in range(args.single_repeats):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                rate = measures[name]()
                if rate is not None:
                    rates[name].append(rate)
            log(f"  {shape} run {r + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items() if v))
    baseline_proc.close()
    return rates["outpost"], rates["llama-cpp-python"], rates["llama-bench"]


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
    parser.add_argument("--repeats", type=int, default=3, help="runs per median (prefill, 4096 cells)")
    parser.add_argument(
        "--single-repeats", type=int, default=15,
        help="rounds of the side-by-side single-stream runs (cheap; single runs drift ~10%% here)",
    )  # fmt: skip
    parser.add_argument(
        "--flash-attn", choices=["auto", "on", "off"], default="auto",
        help="auto (default): what the engine's kernel probe chose on this machine, for every engine",
    )  # fmt: skip
    parser.add_argument(
        "--batched-rounds", type=int, default=3,
        help="rounds of Outpost's and llama-batched-bench's batched decode, in turn (medians)",
    )  # fmt: skip
    parser.add_argument(
        "--batched-only", action="store_true",
        help="only the batched comparison (and Outpost's single stream it is divided by)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline-hugepages", action="store_true",
        help="give llama-cpp-python and llama.cpp's tools the huge pages Outpost runs on (default: "
        "plain pages, as their users run them); compares the engines' loops on equal memory",
    )  # fmt: skip
    parser.add_argument("--baseline-worker", help=argparse.SUPPRESS)
    parser.add_argument("--slots", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--n-ctx", type=int, default=4096, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_worker:
        baseline_worker(args)
        return
    reexec_with_hugepages()  # Outpost's engine runs in this process, as `outpost run` would run it
    args.baseline_env = dict(os.environ) if args.baseline_hugepages else environ_without_hugepages(os.environ)
    copy_bw = copy_bandwidth_bytes_per_s()
    log(f"numpy copy bandwidth: {copy_bw / 1e9:.2f} GB/s (read + write)")
    results: dict[str, Any] = {}
    for shape in args.shapes.split(","):
        log(f"benchmarking {shape} ...")
        results[shape] = run_shape(shape, args, copy_bw)
    results["copy_bandwidth_gb_s"] = round(copy_bw / 1e9, 2)
    results["outpost_hugepages"] = hugepages_enabled()
    results["baseline_hugepages"] = hugepages_enabled(args.baseline_env)
    print(json.dumps(results))
