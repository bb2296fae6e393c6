"""Where speculative greedy output parts from plain greedy output on real llama.cpp, and why.

Runs the benchmark's tasks in-process (one engine, f32-free defaults as served) without and with
each n-gram drafter, greedy, with the two best logprobs at every token of the plain run: the share
of identical texts, and at each parting the plain run's top-2 gap there (logprob differences equal
logit differences). A parting at a near-tie is rounding of batched verification, not a bug.

    python -m benchmarks.spec.parting MODEL.gguf [--max-tokens 96] [--threads 1] [--passes 2]

Each drafter runs `--passes` times per task: ngram-mod's table is shared by all requests (as
llama.cpp's is), so a later pass drafts from what the earlier ones generated, as in the server
benchmark's later rounds; the first pass of a fresh engine drafts little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from benchmarks.spec.tasks import make_tasks
from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams, SpecRequest
from outpost.serving.assembly import Engine


async def _run(
    engine: Engine, prompt: list[int], n: int, spec: str
) -> tuple[list[int], list[list[tuple[int, float]]], int, int]:
    """Greedy ids, each token's two best (id, logprob), and the draft counts."""
    sampling = SamplingParams(temperature=0.0, n_probs=2)
    req = GenerateRequest(prompt, n, sampling, speculative=SpecRequest(spec))
    tokens: list[int] = []
    tops: list[list[tuple[int, float]]] = []
    drafted = accepted = 0
    async for event in engine.client.open(req):
        tokens += event.token_ids
        tops += [[(t, round(lp, 4)) for t, lp in entry.top[:2]] for entry in event.logprobs or []]
        if event.timings is not None:
            drafted, accepted = event.timings.draft_n, event.timings.draft_n_accepted
    return tokens, tops, drafted, accepted


def _gap(top: list[tuple[int, float]]) -> float | None:
    return round(top[0][1] - top[1][1], 4) if len(top) > 1 else None


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--passes", type=int, default=2)
    args = p.parse_args()
    config = EngineConfig(model_path=args.model, n_ctx=4096, n_seq_max=2, n_threads=args.threads)
    rows = []
    with Engine(config, prefix_cache=False) as engine:
        for task in make_tasks():
            prompt = engine.tokenize_prompt(engine.render_chat(task.messages()))
            plain, plain_tops, _, _ = asyncio.run(_run(engine, prompt, args.max_tokens, "none"))
            for spec, attempt in [(s, k) for s in ("ngram-simple", "ngram-mod") for k in range(args.passes)]:
                fast, fast_tops, drafted, accepted = asyncio.run(_run(engine, prompt, args.max_tokens, spec))
                at = next((i for i, (a, b) in enumerate(zip(plain, fast, strict=False)) if a != b), None)
                if at is None and len(plain) != len(fast):
                    at = min(len(plain), len(fast))
                where = at if at is not None and at < min(len(plain_tops), len(fast_tops)) else None
                row: dict[str, object] = {
                    "task": task.name,
                    "spec": spec,
                    "pass": attempt + 1,
                    "identical": at is None,
                    "parting": at,
                    # the plain run's two best there, and the speculative run's: a flip at a near-tie
                    "top2_gap": None if where is None else _gap(plain_tops[where]),
                    "plain_top2": None if where is None else plain_tops[where],
                    "spec_top2": None if where is None else fast_tops[where],
                }
                row |= {"draft_n": drafted, "draft_n_accepted": accepted}
                rows.append(row)
                print(json.dumps(row), flush=True)
    same = sum(1 for r in rows if r["identical"])
    print(json.dumps({"identical": f"{same}/{len(rows)}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
