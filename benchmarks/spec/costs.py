"""What a verified draft costs on this machine, and so the most speculation could gain here.

In-process, on the engine's own loaded model and batch (kernels as the server picks them): at a
given depth (history tokens already in the KV), the time of one llama_decode of k + 1 tokens with
logits at every position, as a verification of k draft tokens is, for k = 0..--max-draft; and with
`--draft`, one draft-model decode at the same depth. Fastest of `--rounds` tries each (another
process taking the core makes a try slower, never faster).

From those, the speedup over plain decoding of a draft of k tokens that is always accepted, which
no drafter can beat: (k + 1) x t(0) / t(k) for an n-gram draft (free to make), and (k + 1) x t(0) /
(t(k) + k x d) for a draft model whose step costs d (each draft token one draft-model decode).

    python -m benchmarks.spec.costs MODEL.gguf [--draft DRAFT.gguf] [--depth 400] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from benchmarks.harness.figures import pyplot, save
from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig, with_probed_kernels
from outpost.engine.model import LoadedModel
from outpost.engine.step_timing import read_history, timed_at


def step_times(path: str, args: argparse.Namespace, sizes: list[int]) -> dict[int, float]:
    """k -> fastest seconds for a decode verifying k draft tokens (k + 1 tokens) at --depth."""
    config, _ = with_probed_kernels(
        EngineConfig(model_path=path, n_ctx=args.depth + 256, n_seq_max=1, n_threads=args.threads)
    )
    with LoadedModel(config) as model:
        batch = TokenBatch(model.n_batch)
        if not read_history(model, batch, args.depth):
            raise RuntimeError("could not read the history")
        token = max(model.vocab.bos, 0)
        best = {k: float("inf") for k in sizes}
        for _ in range(args.rounds):
            for k in sizes:
                best[k] = min(best[k], timed_at(model, batch, [token] * (k + 1), args.depth, k))
        if math.inf in best.values():
            raise RuntimeError("a timed decode failed")
        return best


def bounds(target: dict[int, float], draft_s: float | None) -> list[dict[str, float]]:
    """Per draft length: its verification's cost in plain steps, and the speedup of a draft that is
    always accepted, for a free (n-gram) draft and, given its step, a draft model's."""
    one = target[0]
    rows = []
    for k, t in sorted(target.items()):
        row = {"draft_tokens": k, "ms": round(t * 1000, 2), "steps": round(t / one, 2)}
        row["ngram_bound"] = round((k + 1) * one / t, 2)
        if draft_s is not None:
            row["draft_model_bound"] = round((k + 1) * one / (t + k * draft_s), 2)
        rows.append(row)
    return rows


def _plot(rows: list[dict[str, float]], title: str, out: Path) -> None:
    plt = pyplot()

    ks = [r["draft_tokens"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(ks, [r["ngram_bound"] for r in rows], marker="o", label="n-gram draft, always accepted")
    if "draft_model_bound" in rows[0]:
        ax.plot(ks, [r["draft_model_bound"] for r in rows], marker="s", label="draft model, always accepted")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axhline(1.2, color="tab:red", lw=0.8, ls="--", label="1.2x")
    ax.set_xlabel("draft tokens verified per step")
    ax.set_ylabel("speedup over plain decoding, at most")
    ax.set_title(title, fontsize=9)
    ax.legend()
    save(fig, out, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--draft", help="a draft model (-md): its one-token step at the same depth")
    p.add_argument("--depth", type=int, default=400, help="history tokens in the KV before each step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-draft", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=Path("bench-results/spec-costs"))
    args = p.parse_args()
    sizes = list(range(args.max_draft + 1))
    target = step_times(args.model, args, sizes)
    draft_s = step_times(args.draft, args, [0])[0] if args.draft else None
    rows = bounds(target, draft_s)
    for row in rows:
        print(json.dumps(row), flush=True)
    doc = {"model": args.model, "draft": args.draft, "depth": args.depth, "threads": args.threads}
    if draft_s is not None:
        doc["draft_step_ms"] = round(draft_s * 1000, 2)
        doc["draft_step_in_target_steps"] = round(draft_s / target[0], 2)
        print(json.dumps({k: doc[k] for k in ("draft_step_ms", "draft_step_in_target_steps")}))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "costs.json").write_text(json.dumps(doc | {"rows": rows}, indent=2) + "\n")
    name = Path(args.model).name + (f" + draft {Path(args.draft).name}" if args.draft else "")
    title = f"{name}\nafter {args.depth} tokens of history, {args.threads} threads"
    _plot(rows, title, args.out / "costs.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
