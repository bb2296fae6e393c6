"""The kernel probe's child process (kernel_probe.py): decode rates of each variant, one JSON line.

Run as `python -m outpost.engine.kernel_probe_child MODEL SEQS DEPTH STEPS ROUNDS` (kernel_probe.py
passes its PROBE_* constants). All variants are loaded at once and measured in turn, round after
round, so a slow moment of a shared machine hits them alike; every round's rates are reported. A round
decodes SEQS sequences at DEPTH for STEPS steps, then one sequence alone as many steps; the KV cache
is trimmed back to DEPTH after each.
"""

from __future__ import annotations

import json
import sys
import time
from typing import NamedTuple

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.kernel_probe import DEFAULT, TOGGLES, Variant
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.output import BatchChunk


class ProbeShape(NamedTuple):
    seqs: int
    depth: int
    steps: int
    rounds: int


def _config(model_path: str, variant: Variant, shape: ProbeShape) -> EngineConfig:
    return EngineConfig(
        model_path=model_path,
        n_ctx=shape.seqs * max(256, shape.depth + shape.steps),
        n_batch=256,
        n_seq_max=shape.seqs,
        flash_attn="on" if variant.flash_attn else "off",
        repack="auto" if variant.layout == "repacked" else "off",
        kv_unified="on" if variant.kv_unified else "off",
    )


def _prefill(model: LoadedModel, batch: TokenBatch, shape: ProbeShape) -> None:
    n_vocab = model.vocab.n_tokens
    for seq in range(shape.seqs):
        tokens = [(7 * seq + 13 * i + 100) % n_vocab for i in range(shape.depth)]
        batch.fill([BatchChunk(seq, tokens, 0, True)])
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            raise RuntimeError("prefill failed")


def _steps(model: LoadedModel, batch: TokenBatch, shape: ProbeShape, seqs: int) -> float:
    """tok/s of shape.steps decode steps of `seqs` sequences, from shape.depth."""
    started = time.perf_counter()
    for step in range(shape.steps):
        batch.fill([BatchChunk(seq, [100 + seq], shape.depth + step, True) for seq in range(seqs)])
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            raise RuntimeError("decode failed")
    elapsed = time.perf_counter() - started
    llama.llama_memory_seq_rm(model.memory, -1, shape.depth, -1)
    return seqs * shape.steps / elapsed


def measure(model_path: str, shape: ProbeShape) -> dict[str, dict[str, list[float]]]:
    """{variant name: {"many": tok/s of shape.seqs sequences, "one": tok/s of one}, a rate per
    round, in round order (the parent pairs each variant's rounds with the default's)."""
    variants = {"default": DEFAULT, **TOGGLES}
    loaded = {name: LoadedModel(_config(model_path, v, shape)) for name, v in variants.items()}
    batches = {name: TokenBatch(model.n_batch) for name, model in loaded.items()}
    names = list(loaded)
    many: dict[str, list[float]] = {name: [] for name in names}
    one: dict[str, list[float]] = {name: [] for name in names}
    try:
        for name, model in loaded.items():
            _prefill(model, batches[name], shape)
            _steps(model, batches[name], shape, shape.seqs)  # warm: graph allocation, first touch
        for r in range(shape.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                many[name].append(_steps(loaded[name], batches[name], shape, shape.seqs))
                one[name].append(_steps(loaded[name], batches[name], shape, 1))
    finally:
        for model in loaded.values():
            model.close()
    return {n: {"many": many[n], "one": one[n]} for n in names}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], ProbeShape(*(int(a) for a in sys.argv[2:6])))), flush=True)
