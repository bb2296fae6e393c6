"""`python -m benchmarks.engine.plot OUT.png RESULTS.json... [--title T]`: the engine benchmark's
batched decode as a figure, a panel per run and shape.

Per shape in each RESULTS.json (the JSON line `python -m benchmarks.engine` prints): Outpost's aggregate
decode tok/s at 1, 2, 4 and 8 sequences (the median of the rounds, each round a dot), llama-batched-
bench's beside it where it ran, and the line 8 sequences must reach: `--target` (default 1.8) times
the 1-slot single stream on a slot of the same size (its median over the rounds).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from benchmarks.harness.figures import pyplot, save


def series(shape: dict[str, Any]) -> dict[str, Any]:
    """The figure's numbers from one shape's results: widths, medians, each round's, the target's."""
    widths = sorted(shape["batched_tok_s"], key=int)
    baseline = shape.get("llama_batched_bench_tok_s") or {}
    return {
        "widths": [int(w) for w in widths],
        "outpost": [shape["batched_tok_s"][w] for w in widths],
        "outpost_rounds": [[r[w] for w in widths] for r in shape["batched_tok_s_rounds"]],
        "llama": [baseline.get(w) for w in widths] if baseline else None,
        "single": shape["single_tok_s_in_rounds"],
        "ratio": shape["batched_8_over_single"],
    }


def panels(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each run's shapes with batched results, titled "run: shape" (or the shape alone for one run)."""
    out: dict[str, dict[str, Any]] = {}
    for run, results in runs.items():
        for name, shape in results.items():
            if isinstance(shape, dict) and "batched_tok_s" in shape:
                out[name if len(runs) == 1 else f"{run}: {name}"] = series(shape)
    if not out:
        raise ValueError("no batched results in these files (run python -m benchmarks.engine first)")
    return out


def _highest(s: dict[str, Any], target: float) -> float:
    rounds = [v for rates in s["outpost_rounds"] for v in rates]
    return float(max(target * s["single"], *s["outpost"], *rounds, *(s["llama"] or [])))


def plot(runs: dict[str, dict[str, Any]], path: Path, title: str, target: float = 1.8) -> None:
    plt = pyplot()

    drawn = panels(runs)
    top = 1.1 * max(_highest(s, target) for s in drawn.values())
    fig, axes = plt.subplots(1, len(drawn), figsize=(5.5 * len(drawn), 4), squeeze=False, sharey=True)
    for ax, (name, s) in zip(axes[0], drawn.items(), strict=True):
        ax.plot(s["widths"], s["outpost"], marker="o", label=f"Outpost (8 / 1-slot: {s['ratio']:.2f}x)")
        for rates in s["outpost_rounds"]:
            ax.scatter(s["widths"], rates, s=10, color="C0", alpha=0.4)
        if s["llama"]:
            ax.plot(s["widths"], s["llama"], marker="s", label="llama-batched-bench")
        single = f"1-slot single stream ({s['single']:.0f})"
        ax.axhline(s["single"], color="grey", linestyle=":", label=single)
        ax.axhline(target * s["single"], color="red", linestyle="--", label=f"{target}x the single stream")
        ax.set_xticks(s["widths"])
        ax.set_xlabel("sequences decoding together")
        ax.set_ylim(0, top)
        ax.set_title(name, fontsize=9)
        ax.legend(fontsize=7, loc="lower right")
    axes[0][0].set_ylabel("aggregate decode tok/s")
    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=8)
    save(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("results", type=Path, nargs="+")
    parser.add_argument("--title", default="engine benchmark: batched decode")
    parser.add_argument("--target", type=float, default=1.8)
    args = parser.parse_args()
    runs = {path.stem: json.loads(path.read_text().strip().splitlines()[-1]) for path in args.results}
    plot(runs, args.out, args.title, args.target)
    print(args.out)


if __name__ == "__main__":
    main()
