"""The AMX probe's child process (`python -m outpost.engine.amx_child MODEL`, run by cpu_probe.py):
it may die of SIGILL, so it runs apart from the process that asked."""

from __future__ import annotations

import sys

from outpost.engine.batch import TokenBatch
from outpost.engine.config import EngineConfig
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.scheduler.output import BatchChunk


def probe_child(model_path: str) -> None:
    """Decodes one 4-token batch with llama.cpp's extra buffer types; dies with SIGILL if tiles fault."""
    cfg = EngineConfig(model_path=model_path, n_ctx=64, n_batch=8, n_ubatch=8, n_seq_max=1, repack="on")
    model = LoadedModel(cfg)
    try:
        batch = TokenBatch(8)
        batch.fill([BatchChunk(0, [1, 2, 3, 4], 0, True)])
        status = int(llama.llama_decode(model.ctx, batch.struct))
    finally:
        model.close()
    sys.exit(0 if status == 0 else 3)


if __name__ == "__main__":
    probe_child(sys.argv[1])
