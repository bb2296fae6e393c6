"""Host sampling benchmark: the sampler's time per step on real SmolLM2-135M logits.

Not a test. Run:  python -m benchmarks.sampling [--model smollm2:135m-q4_1|PATH] [--steps 60]
                  [--sizes 1,16,64,128] [--arms chain,batched]

Logits rows come from the real SmolLM2-135M-Instruct answering real chat prompts (capture.py: peaked,
as in service), cached under $OUTPOST_HOME/bench/; a second table uses random logits (each N(0, 3^2)),
a flat worst case. Each step writes n rows into one context's output buffer (not timed), then times
sampling every one of them at temperature 0.8 / top-p 0.95 (Outpost's other defaults: top-k 40,
min-p 0.05), one fixed seed per sequence. Arms:
  chain    one llama.cpp sampler chain per sequence, llama_sampler_sample row by row (the path before
           issue 42: a full-vocabulary candidate array per sequence);
  batched  outpost/engine/host_sampling.py: all rows at once, candidates prefiltered by group maxima.
Then whole decode steps (llama_decode + sampling) at --decode-sizes sequences, with the sampler in
llama.cpp's graph (backend sampling) and on the host (decode.py): what --backend-sampling's default
rests on.
Reports the median milliseconds per step over --steps steps (>= 50), and the least (what the code
costs when nothing else runs: on a shared machine the median also holds other processes' time).
The machine it runs on should be named with the figures. Progress goes to stderr; the last stdout
line is one JSON object of the batched arm's median ms per step on the real logits, keyed by the
number of sequences.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

from benchmarks.sampling.capture import LogitsStage, capture_rows
from benchmarks.sampling.decode import step_medians
from outpost.engine.config import EngineConfig
from outpost.engine.model import LoadedModel
from outpost.engine.sampling import SamplerChain
from outpost.home import outpost_home
from outpost.messages import SamplingParams
from outpost.models.store import ModelNotPulled, resolve_model_arg

PARAMS = SamplingParams(temperature=0.8, top_p=0.95)
CAPTURE_STEPS = 16  # rows per prompt: 32 prompts x 16 = 512 rows, rotated through the steps
Sampler = Callable[[list[int]], list[int]]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def real_rows(model: LoadedModel, model_path: str) -> npt.NDArray[np.float32]:
    cache = outpost_home() / "bench" / f"sampling-rows-{Path(model_path).stem}-{CAPTURE_STEPS}.npy"
    if cache.exists():
        return np.load(cache)
    log(f"capturing logits rows into {cache} (once) ...")
    rows = capture_rows(model, CAPTURE_STEPS)
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.save(cache, rows)
    return rows


def chain_arm(model: LoadedModel, n: int) -> tuple[Sampler, Callable[[], None]]:
    vocab = model.vocab
    chains = [
        SamplerChain(replace(PARAMS, seed=seq), vocab.handle, vocab.n_tokens, vocab.eog_ids)
        for seq in range(n)
    ]

    def sample(indices: list[int]) -> list[int]:
        return [chain.sample(model.ctx, index) for chain, index in zip(chains, indices, strict=True)]

    def close() -> None:
        for chain in chains:
            chain.free()

    return sample, close


def batched_arm(model: LoadedModel, n: int) -> tuple[Sampler, Callable[[], None]]:
    from outpost.engine.host_sampling import HostSampler

    vocab = model.vocab
    sampler = HostSampler(vocab.n_tokens)
    seqs = [sampler.sequence(PARAMS, vocab.eog_ids, seq) for seq in range(n)]
    assert all(s is not None for s in seqs), "the benchmark's parameters take the batched path"

    def sample(indices: list[int]) -> list[int]:
        return sampler.sample(model.ctx, [(s, i) for s, i in zip(seqs, indices, strict=True) if s])

    return sample, lambda: None


ARMS = {"chain": chain_arm, "batched": batched_arm}


def time_arm(
    stage: LogitsStage, rows: npt.NDArray[np.float32], arm: str, n: int, steps: int
) -> tuple[float, float]:
    sample, close = ARMS[arm](stage.model, n)
    times: list[float] = []
    try:
        for step in range(steps + 2):  # two warm-up steps, not counted
            picks = np.arange(step * n, (step + 1) * n) % len(rows)
            indices = stage.load(rows[picks])
            t0 = time.perf_counter()
            sample(indices)
            if step >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
    finally:
        close()
    return statistics.median(times), min(times)


def table(
    stage: LogitsStage, rows: npt.NDArray[np.float32], title: str, args: argparse.Namespace
) -> dict[str, dict[int, float]]:
    print(f"\n{title}\n| sequences | " + " | ".join(f"{a} ms/step (min)" for a in args.arms) + " |")
    print("|---:|" + "---:|" * len(args.arms))
    medians: dict[str, dict[int, float]] = {arm: {} for arm in args.arms}
    for n in args.sizes:
        cells = []
        for arm in args.arms:
            med, least = time_arm(stage, rows, arm, n, args.steps)
            medians[arm][n] = med
            cells.append(f"{med:.3f} ({least:.3f})")
            log(f"{title}: {arm} x{n}: {med:.3f} ms")
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    return medians


def decode_table(config: EngineConfig, args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.decode_sizes.split(",") if s]
    if not sizes:
        return
    print("\nwhole decode steps (llama_decode + sampling), median ms per step")
    print("| sequences | host sampler | backend sampling (in the graph) |\n|---:|---:|---:|")
    for n in sizes:
        medians = step_medians(config, n, args.decode_steps, PARAMS)
        log(f"decode x{n}: {medians}")
        print(f"| {n} | {medians['host']:.2f} | {medians['graph']:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2:135m-q4_1", help="a pulled model name or a .gguf path")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per cell (>= 50)")
    ap.add_argument("--sizes", default="1,16,64,128")
    ap.add_argument("--arms", default="chain,batched")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--decode-sizes",
        default="16",
        help="sequence counts for whole decode steps, backend sampling vs the host sampler ('' skips)",
    )
    ap.add_argument("--decode-steps", type=int, default=30)
    args = ap.parse_args(argv)
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.arms = args.arms.split(",")
    if args.steps < 50 or not set(args.arms) <= set(ARMS):
        ap.error(f"--steps must be >= 50 and --arms a subset of {','.join(ARMS)}")
    try:
        path = resolve_model_arg(args.model)
    except ModelNotPulled as exc:
        log(f"{exc}: run `outpost pull smollm2:135m-q4_1` first, or give --model PATH")
        return 2
    width = max(args.sizes)
    config = EngineConfig(
        model_path=path,
        n_ctx=8192,
        n_batch=2048,
        n_seq_max=max(width, 32),
        n_threads=args.threads,
        kv_unified="on",
    )
    with LoadedModel(config) as model:
        rows = real_rows(model, path)
        stage = LogitsStage(model, width)
        real = table(stage, rows, f"SmolLM2-135M logits ({rows.shape[1]} vocab)", args)
        flat = np.random.default_rng(0).normal(0.0, 3.0, size=(256, rows.shape[1])).astype(np.float32)
        table(stage, flat, "random logits, N(0, 3^2)", args)
    decode_table(config, args)
    result = real["batched"] if "batched" in real else real[args.arms[-1]]
    print(json.dumps({str(n): round(ms, 4) for n, ms in result.items()}))
    return 0
