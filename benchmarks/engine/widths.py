"""Outpost's decode step at every width from 1 to a server's slots: where a step's cost jumps.

Run: python -m benchmarks.engine.widths [--shape smollm2-135m] [--slots 16] [--widths 1-16]
       [--depth 128] [--tokens 48] [--rounds 2] [--threads 2] [--plot PNG]
One engine with `slots` sequences and the kernels its start-up probe picks on this machine (as
`outpost serve -np slots` runs), on huge pages as users run it. For each width, `width` requests
with distinct prompts of `depth` tokens decode `tokens` tokens together; reported: the aggregate
decode tok/s while all of them decode (benchmarks/engine/main.py's `outpost_parallel`) and the
step's milliseconds (width / tok/s), medians over the rounds, the widths in turn round by round
(this machine's speed drifts). No HTTP: the engine's own step, the llama_decode column of
`python -m benchmarks.serve.steps` plus sampling. On repacked weights llama.cpp multiplies four
rows at a time and each row left over on its own (ggml-cpu/repack.cpp, forward_mul_mat_one_chunk),
which this sweep shows as steps of 4k+3 sequences that cost more than steps of 4k+4.
Progress on stderr; a markdown table, then one JSON object, on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import textwrap
from pathlib import Path

from benchmarks.engine.main import outpost_parallel
from benchmarks.harness.common import bench_model, log
from benchmarks.harness.figures import pyplot, save
from outpost.engine.config import EngineConfig, with_probed_kernels
from outpost.engine.hugepages import reexec_with_hugepages
from outpost.serving.assembly import Engine

KV_CELLS_PER_SLOT = 1024  # as benchmarks/serve gives llama-server and Outpost (-c 1024 x np)


def parse_widths(text: str) -> list[int]:
    """ "1-16" or "3,4,7,8" (or both: "1-4,8") -> the widths, in order, each once."""
    widths: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        for w in range(int(low), int(high or low) + 1):
            if w < 1:
                raise ValueError(f"a width is at least 1 (got {w})")
            if w not in widths:
                widths.append(w)
    return widths


def sweep(engine: Engine, widths: list[int], args: argparse.Namespace) -> dict[int, list[float]]:
    """tok/s per width, one value per round; odd rounds run the widths in reverse."""
    got: dict[int, list[float]] = {w: [] for w in widths}
    for r in range(args.rounds):
        for w in widths if r % 2 == 0 else widths[::-1]:
            tps = outpost_parallel(engine, args.depth, args.tokens, w)
            got[w].append(tps)
            ms = 1e3 * w / tps
            log(f"  round {r + 1}/{args.rounds}, {w} sequences: {tps:.1f} tok/s, {ms:.1f} ms a step")
    return got


def summary(got: dict[int, list[float]]) -> dict[int, dict[str, float]]:
    """Per width, the median tok/s and the step it makes (width / tok/s)."""
    medians = {w: statistics.median(v) for w, v in got.items()}
    return {w: {"tok_s": round(m, 1), "ms_step": round(1e3 * w / m, 1)} for w, m in medians.items()}


def markdown(rows: dict[int, dict[str, float]]) -> str:
    lines = ["| sequences | decode tok/s | ms a step |", "|---:|---:|---:|"]
    lines += [f"| {w} | {r['tok_s']:.1f} | {r['ms_step']:.1f} |" for w, r in rows.items()]
    return "\n".join(lines)


def plot(rows: dict[int, dict[str, float]], title: str, path: Path) -> None:
    plt = pyplot()

    widths = list(rows)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(widths, [rows[w]["ms_step"] for w in widths], marker="o")
    for w in widths:
        if w % 4 == 0:
            ax.axvline(w, color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlabel("sequences decoding together")
    ax.set_ylabel("ms a step (median)")
    ax.set_xticks(widths)
    ax.set_title("\n".join(textwrap.wrap(title, 90)), fontsize=8)
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--quant", default="q4_0")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--widths", default="1-16", help="e.g. 1-16 or 3,4,7,8 (at most --slots)")
    parser.add_argument("--depth", type=int, default=128, help="prompt tokens before decoding")
    parser.add_argument("--tokens", type=int, default=48, help="tokens each sequence decodes")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plot", type=Path, help="write the ms-a-step curve here (PNG)")
    args = parser.parse_args()
    widths = parse_widths(args.widths)
    if max(widths) > args.slots:
        parser.error(f"--widths go up to {max(widths)}, beyond --slots {args.slots}")
    reexec_with_hugepages()
    config = EngineConfig(
        model_path=str(bench_model(args.shape, args.quant)), n_ctx=KV_CELLS_PER_SLOT * args.slots,
        n_batch=512, n_seq_max=args.slots, n_threads=args.threads,
    )  # fmt: skip
    config, kernels = with_probed_kernels(config)
    described = kernels.describe() if kernels else "as asked"
    log(f"{args.shape} {args.quant}, {args.slots} slots: kernels {described}")
    with Engine(config, prefix_cache=False) as engine:
        rows = summary(sweep(engine, widths, args))
    print(markdown(rows))
    if args.plot:
        plot(rows, f"{args.shape} {args.quant}, {args.slots} slots: {described}", args.plot)
    print(json.dumps({"shape": args.shape, "quant": args.quant, "slots": args.slots, "kernels": described,
                      "widths": rows}))  # fmt: skip


if __name__ == "__main__":
    main()
