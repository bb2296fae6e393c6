"""`outpost serve` with several models (or one that sleeps): which models, each as a `ModelSource`,
and the `ModelPool` over them (outpost/serving/model_pool.py).

The models are every GGUF in `--models-dir` named by its file stem (llama-server's router names), or
every model in the store by its store name (Ollama's `ollama serve`). Each is sized as `outpost serve
-m` would size it alone (outpost/sizing: slots, context, threads from the machine and the flags); the
pool's memory budget is the memory sizing found available, so what decides whether a model fits beside
the loaded ones is the same arithmetic that sizes one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outpost.backend import InferenceBackend, PromptCodec
from outpost.commands.engine import sized, start_local_backend
from outpost.engine.codec import VocabOnlyModel, load_codec
from outpost.models.store import ModelStore
from outpost.serving.model_pool import ModelPool, PoolLimits
from outpost.settings import EngineSettings
from outpost.settings.commands import ModelPoolSettings
from outpost.sizing import NotEnoughMemory, Plan

SHARD = "-00001-of-"  # a split GGUF's first file; its other parts are not models of their own


def models_in_dir(directory: str) -> dict[str, str]:
    """name -> path for every model file directly in `directory` (a split one by its first shard)."""
    found: dict[str, str] = {}
    for path in sorted(Path(directory).glob("*.gguf")):
        stem = path.stem
        if "-of-" in stem and SHARD not in stem:
            continue
        found[stem.split(SHARD)[0] if SHARD in stem else stem] = str(path)
    if not found:
        raise ValueError(f"--models-dir {directory}: no .gguf file in it")
    return found


def models_in_store() -> dict[str, str]:
    """name -> path for every model in the store whose file is there (empty when it holds none)."""
    store = ModelStore()
    paths = {m.name: store.path_of(m) for m in store.manifests()}
    return {name: str(path) for name, path in paths.items() if path.is_file()}


@dataclass
class LocalModelSource:
    """A GGUF file as the pool knows it before it loads: its vocab, its sizing plan (None where it
    cannot fit this machine as asked: `refusal` says why)."""

    path: str
    engine: EngineSettings  # the server's flags, sized for this model
    plan: Plan | None
    max_queue: int
    vocab: VocabOnlyModel
    refusal: str | None = None

    @property
    def codec(self) -> PromptCodec:
        return self.vocab.codec

    @property
    def n_ctx_seq(self) -> int:
        # Until loaded, the positions one slot surely has (a unified KV cache may let it have more).
        trained = self.vocab.n_ctx_train
        if self.plan is None:
            return trained
        return min(self.plan.positions, trained) if trained else self.plan.positions

    @property
    def need_bytes(self) -> int:
        if self.plan is None:
            return Path(self.path).stat().st_size
        return self.plan.kv_bytes + self.plan.reserved_bytes

    def facts(self) -> dict[str, Any]:
        return {
            **self.vocab.describe(),
            "model_path": self.path,
            "size_bytes": Path(self.path).stat().st_size,
        }

    def load(self) -> InferenceBackend:
        return start_local_backend(self.engine, self.path, self.max_queue)

    def close(self) -> None:
        self.vocab.close()


def model_source(engine: EngineSettings, path: str, max_queue: int) -> LocalModelSource:
    vocab = load_codec(path, engine.template_text())
    try:
        settings, plan = sized(engine.model_copy(update={"model": path}), path)
    except NotEnoughMemory as exc:  # served, and refused with this when asked for
        return LocalModelSource(path, engine, None, max_queue, vocab, " ".join(str(exc).split()))
    return LocalModelSource(path, settings, plan, max_queue, vocab)


def build_pool(
    models: dict[str, str],
    engine: EngineSettings,
    own: ModelPoolSettings,
    max_queue: int,
    preload: tuple[str, ...] = (),
    autoload: bool = True,
) -> ModelPool:
    """The pool of `models` (name -> path): sized, vocab read, none loaded yet (runs in a thread).
    max_queue: each engine's requests waiting beyond its slots."""
    sources = {name: model_source(engine, path, max_queue) for name, path in models.items()}
    budget = min((s.plan.memory.available for s in sources.values() if s.plan is not None), default=0)
    limits = PoolLimits(
        models_max=own.models_max,
        memory_bytes=budget,
        autoload=autoload,
        load_wait_s=own.model_load_timeout,
        idle_unload_s=float(own.sleep_idle_seconds) if own.sleep_idle_seconds >= 0 else None,
    )
    return ModelPool(sources, limits, preload)
