"""llama.cpp's own decode at a server's widths with each CPU kernel option: a step's time per choice.

Run: LLAMA_BATCHED_BENCH=$B/llama-batched-bench python -m benchmarks.engine.kernels
       [--shape smollm2-135m] [--widths 4,8,16] [--depth 130] [--tokens 128] [--rounds 2]
       [--threads 2] [--plot PNG]
For each combination of flash attention (on / off), KV layout (a stream per sequence, or one
unified pool: -kvu) and weight layout (repacked / plain), llama-batched-bench decodes `widths`
sequences together on the same synthetic model after a prompt of `depth` tokens each. Reported: its
S_TG (aggregate decode tok/s) and the decode step's milliseconds (width / S_TG), medians over the
rounds, the combinations taken in turn round by round (this machine's speed drifts). No sampling and
no HTTP: the kernels' own step, to set beside the llama_decode column of
`python -m benchmarks.serve.steps` (what Outpost's steps spend in the same call).
Progress on stderr; a markdown table, then one JSON object, on stdout.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
from pathlib import Path

from benchmarks.engine.main import llama_batched_bench
from benchmarks.harness.common import bench_model, log
from benchmarks.harness.figures import pyplot, save
from outpost.engine.config import available_cpus

CHOICES = list(itertools.product(("on", "off"), (False, True), ("repacked", "plain")))


def label(fa: str, unified: bool, layout: str) -> str:
    return f"fa {fa}, {'unified KV' if unified else 'KV per stream'}, {layout}"


def sweep(args: argparse.Namespace, binary: str, model: Path) -> dict[str, dict[str, list[float]]]:
    """tok/s per choice and width, one value per round."""
    got: dict[str, dict[str, list[float]]] = {label(*c): {} for c in CHOICES}
    for r in range(args.rounds):
        order = CHOICES if r % 2 == 0 else CHOICES[::-1]
        for fa, unified, layout in order:
            rates = llama_batched_bench(
                binary, model, args.threads, args.depth, args.tokens, fa, layout, dict(os.environ),
                unified, tuple(args.widths),
            )  # fmt: skip
            name = label(fa, unified, layout)
            log(f"round {r + 1}/{args.rounds} {name}: {rates}")
            for width, rate in (rates or {}).items():
                got[name].setdefault(width, []).append(rate)
    return got


def markdown(medians: dict[str, dict[str, float]], widths: list[int]) -> str:
    head = "| kernels | " + " | ".join(f"{w} seqs: tok/s (step ms)" for w in widths) + " |"
    rows = [head, "|---|" + "---:|" * len(widths)]
    for name, rates in medians.items():
        cells = [
            f"{rates[str(w)]:.1f} ({1e3 * w / rates[str(w)]:.1f})" if str(w) in rates else "-" for w in widths
        ]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def plot(medians: dict[str, dict[str, float]], widths: list[int], path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, rates in medians.items():
        shown = [w for w in widths if str(w) in rates]
        ax.plot(shown, [1e3 * w / rates[str(w)] for w in shown], marker="o", label=name)
    ax.set_xlabel("sequences decoding together")
    ax.set_ylabel("decode step (ms), llama-batched-bench")
    ax.set_xticks(widths)
    ax.set_title("llama.cpp's decode step by kernel choice")
    ax.legend(fontsize=7)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--widths", default="4,8,16", type=lambda t: [int(w) for w in t.split(",")])
    p.add_argument("--depth", type=int, default=130, help="prompt tokens per sequence (the serve workload's)")
    p.add_argument("--tokens", type=int, default=128, help="tokens each sequence decodes")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=available_cpus())
    p.add_argument("--plot", type=Path)
    args = p.parse_args()
    binary = os.environ.get("LLAMA_BATCHED_BENCH")
    if not binary:
        raise SystemExit(
            "set LLAMA_BATCHED_BENCH to llama-batched-bench (../shared/tools/build-llama-cpp.sh)"
        )
    got = sweep(args, binary, bench_model(args.shape, args.quant))
    medians = {name: {w: statistics.median(v) for w, v in rates.items()} for name, rates in got.items()}
    print(markdown(medians, args.widths))
    if args.plot is not None:
        plot(medians, args.widths, args.plot)
        log(f"plot: {args.plot}")
    print(json.dumps({"widths": args.widths, "tok_s": medians, "rounds": got}, separators=(",", ":")))


if __name__ == "__main__":
    main()
