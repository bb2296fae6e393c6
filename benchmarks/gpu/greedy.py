"""Greedy token ids of Outpost's engine vs llama.cpp's llama-server on the same prompts, same -ngl.

Not a test. scripts/gpu-bench.sh runs it (benchmarks/gpu/greedy.py) on a GPU machine (and, to check
the plumbing, on the CPU):
    python -m benchmarks.gpu greedy --model M.gguf --llama-server BIN [--ngl 99] [--prompts 16]
        [--tokens 64] --out greedy.json

Each prompt is a run of token ids (seeded, special tokens left out), sent as ids to both sides one
request at a time (the same single-sequence batches on both; EOS ignored, so every answer has
--tokens tokens): Outpost's engine in this process (`assembly.Engine`, the scheduler and runner
`outpost serve` uses, -ngl as given) with the top two logprobs per token, and llama-server's
/completion with `n_probs: 2` (logprobs before sampling). Random weights make near-ties, where two
builds' rounding may pick different tokens: for each prompt, the tokens before the first
difference, and at that parting each side's gap between its top two logprobs. Writes --out (JSON)
and prints a one-line summary.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from benchmarks.harness.common import log, wait_ready
from benchmarks.harness.ports import free_port
from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams
from outpost.serving.assembly import Engine

Side = list[tuple[int, list[tuple[int, float]]]]  # per token: (id, [(top id, logprob), ...])


def make_prompts(engine: Engine, count: int, length: int, seed: int) -> list[list[int]]:
    """`count` runs of `length` ordinary token ids (no control tokens), BOS first where the model has one."""
    vocab = engine.model.vocab
    rng = random.Random(seed)
    # Control tokens render as nothing without `special`: what is left is ordinary text.
    ordinary = [t for t in range(vocab.n_tokens) if not vocab.is_eog(t) and vocab.token_to_piece(t)]
    bos = vocab.bos if vocab.add_bos and vocab.bos >= 0 else None
    return [([bos] if bos is not None else []) + rng.sample(ordinary, length) for _ in range(count)]


def outpost_greedy(engine: Engine, prompt: list[int], tokens: int) -> Side:
    sampling = SamplingParams(temperature=0.0, n_probs=2, ignore_eos=True, seed=0)
    out: Side = []
    for event in engine.client.generate_sync(GenerateRequest(list(prompt), tokens, sampling)):
        if event.error:
            raise RuntimeError(f"outpost: {event.error}")
        for lp in event.logprobs or []:
            out.append((lp.token, [(t, v) for t, v in lp.top]))
    return out


def server_greedy(url: str, prompt: list[int], tokens: int) -> Side:
    body = {
        "prompt": prompt,
        "n_predict": tokens,
        "temperature": 0.0,
        "n_probs": 2,
        "ignore_eos": True,
        "cache_prompt": False,
        "return_tokens": True,
    }
    reply = httpx.post(f"{url}/completion", json=body, timeout=600).json()
    if "completion_probabilities" not in reply:
        raise RuntimeError(f"llama-server: {json.dumps(reply)[:500]}")
    return [
        (int(p["id"]), [(int(t["id"]), float(t["logprob"])) for t in p["top_logprobs"]])
        for p in reply["completion_probabilities"]
    ]


def gap(top: list[tuple[int, float]]) -> float | None:
    """The top logprob's lead over the second: how near a tie the pick was."""
    return top[0][1] - top[1][1] if len(top) >= 2 else None


def compare(ours: Side, theirs: Side) -> dict[str, Any]:
    """Tokens before the first difference and, there, both sides' picks and top-2 gaps."""
    same = 0
    while same < min(len(ours), len(theirs)) and ours[same][0] == theirs[same][0]:
        same += 1
    entry: dict[str, Any] = {"tokens": len(ours), "identical_prefix": same, "identical": same == len(ours)}
    if same < min(len(ours), len(theirs)):
        entry["parting"] = {
            "index": same,
            "outpost": {"token": ours[same][0], "top2": ours[same][1], "gap": gap(ours[same][1])},
            "llama_server": {"token": theirs[same][0], "top2": theirs[same][1], "gap": gap(theirs[same][1])},
        }
    entry["outpost_ids"] = [t for t, _ in ours]
    entry["llama_server_ids"] = [t for t, _ in theirs]
    return entry


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(r["tokens"] for r in results) or 1
    partings = [r["parting"] for r in results if "parting" in r]
    gaps = [g for p in partings for g in (p["outpost"]["gap"], p["llama_server"]["gap"]) if g is not None]
    return {
        "prompts": len(results),
        "identical_sequences": sum(r["identical"] for r in results),
        "share_identical_sequences": sum(r["identical"] for r in results) / max(1, len(results)),
        "share_tokens_before_parting": sum(r["identical_prefix"] for r in results) / tokens,
        "partings": len(partings),
        "max_top2_gap_at_partings": max(gaps) if gaps else None,
        "top2_gaps_at_partings": gaps,
    }


def start_llama_server(args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    argv = [args.llama_server, "-m", str(args.model), "-ngl", str(args.ngl), "-np", "1", "-c", str(args.ctx)]
    argv += ["-t", str(args.threads), "--host", "127.0.0.1", "--port", str(port), "-fit", "off"]
    log(f"$ {' '.join(argv)}")
    proc = subprocess.Popen(argv, stdout=log_path.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, 600)
    return proc, url


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--llama-server", required=True, help="the llama-server binary")
    p.add_argument("--ngl", type=int, default=99, help="-ngl for both (0: the CPU)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=48)
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens per prompt")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--ctx", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    config = EngineConfig(
        model_path=str(args.model),
        n_ctx=args.ctx,
        n_seq_max=1,
        n_threads=args.threads,
        n_gpu_layers=-1 if args.ngl >= 99 else args.ngl,
    )
    engine = Engine(config, prefill_budget="off")
    proc, url = start_llama_server(args, args.out.with_suffix(".llama-server.log"))
    results: list[dict[str, Any]] = []
    try:
        prompts = make_prompts(engine, args.prompts, args.prompt_tokens, args.seed)
        for prompt in prompts:
            results.append(
                compare(outpost_greedy(engine, prompt, args.tokens), server_greedy(url, prompt, args.tokens))
            )
            report = {"args": {k: str(v) for k, v in vars(args).items()}, "summary": summarize(results)}
            args.out.write_text(json.dumps({**report, "results": results}, indent=1))  # partial as it goes
    finally:
        proc.terminate()
        proc.wait(30)
        engine.close()
    summary = summarize(results)
    log(f"greedy: {summary['identical_sequences']}/{summary['prompts']} sequences identical")
    print(json.dumps({k: v for k, v in summary.items() if k != "top2_gaps_at_partings"}), file=sys.stdout)


if __name__ == "__main__":
    main()
