"""The kernel probe's child process (kernel_probe.py): decode rates of each variant, one JSON line.

Run as `python -m outpost.engine.kernel_probe_child MODEL FAMILY`. All variants are loaded at once
and measured in turn, round after round, so a slow moment of a shared machine hits them alike; each
variant's median counts. A step decodes PROBE_SEQS sequences at PROBE_DEPTH (the KV cache is trimmed
back to that depth after every round), then one sequence alone for as many steps.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.kernel_probe import (
    DEFAULT,
    PROBE_DEPTH,
    PROBE_ROUNDS,
    PROBE_SEQS,
    PROBE_STEPS,
    TOGGLES,
    Variant,
)
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.output import BatchChunk


def _config(model_path: str, variant: Variant) -> EngineConfig:
    return EngineConfig(
        model_path=model_path,
        n_ctx=PROBE_SEQS * 256,
        n_batch=256,
        n_seq_max=PROBE_SEQS,
        flash_attn="on" if variant.flash_attn else "off",
        repack="auto" if variant.layout == "repacked" else "off",
        kv_unified="on" if variant.kv_unified else "off",
    )


def _prefill(model: LoadedModel, batch: TokenBatch) -> None:
    n_vocab = model.vocab.n_tokens
    for seq in range(PROBE_SEQS):
        tokens = [(7 * seq + 13 * i + 100) % n_vocab for i in range(PROBE_DEPTH)]
        batch.fill([BatchChunk(seq, tokens, 0, True)])
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            raise RuntimeError("prefill failed")


def _steps(model: LoadedModel, batch: TokenBatch, seqs: int) -> float:
    """tok/s of PROBE_STEPS decode steps of `seqs` sequences, from PROBE_DEPTH."""
    started = time.perf_counter()
    for step in range(PROBE_STEPS):
        batch.fill([BatchChunk(seq, [100 + seq], PROBE_DEPTH + step, True) for seq in range(seqs)])
        if llama.llama_decode(model.ctx, batch.struct) != 0:
            raise RuntimeError("decode failed")
    elapsed = time.perf_counter() - started
    llama.llama_memory_seq_rm(model.memory, -1, PROBE_DEPTH, -1)
    return seqs * PROBE_STEPS / elapsed


def main(model_path: str) -> None:
    variants = {"default": DEFAULT, **TOGGLES}
    loaded = {name: LoadedModel(_config(model_path, v)) for name, v in variants.items()}
    batches = {name: TokenBatch(model.n_batch) for name, model in loaded.items()}
    try:
        for name, model in loaded.items():
            _prefill(model, batches[name])
            _steps(model, batches[name], PROBE_SEQS)  # warm: graph allocation, first touch
        many: dict[str, list[float]] = {name: [] for name in loaded}
        one: dict[str, list[float]] = {name: [] for name in loaded}
        names = list(loaded)
        for r in range(PROBE_ROUNDS):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                many[name].append(_steps(loaded[name], batches[name], PROBE_SEQS))
                one[name].append(_steps(loaded[name], batches[name], 1))
    finally:
        for model in loaded.values():
            model.close()
    rates = {n: {"many": statistics.median(many[n]), "one": statistics.median(one[n])} for n in names}
    print(json.dumps(rates), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
