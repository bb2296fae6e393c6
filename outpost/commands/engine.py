"""An engine from `EngineSettings`: its `EngineConfig`, its "auto" sizes decided, the running engine.

Shared by `outpost serve` and `outpost worker`, the two commands that load a model.
"""

from __future__ import annotations

from typing import Any

from outpost.engine.config import EngineConfig, resolve_flash_attn
from outpost.models.lora import check_lora_adapter
from outpost.serving.assembly import Engine
from outpost.serving.local_backend import LocalBackend
from outpost.serving.lora_defaults import LoraDefaults
from outpost.settings import EngineSettings
from outpost.settings.fields import existing_file
from outpost.sizing import Asked, Gpu, Plan, size_for_model
from outpost.sizing.offload import offloadable


def engine_config(settings: EngineSettings, model_path: str) -> EngineConfig:
    """The engine's config; "auto" values not sized yet (see `sized`) fall back to 4 slots, the
    trained context (at most 8192) and every usable core."""
    existing_file(model_path)
    options: dict[str, Any] = {
        "model_path": model_path,
        "n_ctx": settings.ctx_size if isinstance(settings.ctx_size, int) else 0,
        "n_batch": settings.batch_size,
        "n_ubatch": settings.ubatch_size,
        "n_seq_max": settings.parallel if isinstance(settings.parallel, int) else 4,
        "n_gpu_layers": settings.n_gpu_layers if isinstance(settings.n_gpu_layers, int) else 0,
        "split_mode": settings.split_mode,
        "flash_attn": settings.flash_attn,
        "repack": settings.repack,
        "kv_unified": settings.kv_unified,
        "backend_sampling": {None: "auto", True: "on", False: "off"}[settings.backend_sampling],
        "chat_template": settings.template_text(),
    }
    if isinstance(settings.threads, int):
        options["n_threads"] = settings.threads
    adapters = tuple(path for path, _ in settings.lora_adapters)
    for path in adapters:  # a wrong adapter is a usage error, before llama.cpp would refuse it
        check_lora_adapter(path, model_path)
    options["lora_adapters"] = adapters
    return EngineConfig.model_validate(options)


def _offload_targets(settings: EngineSettings) -> tuple[Gpu, ...]:
    """The GPUs llama.cpp would put layers on, read from its device list only when -ngl asks for
    layers there."""
    if settings.n_gpu_layers == 0:
        return ()
    from outpost.engine.devices import gpu_devices

    return offloadable(gpu_devices(), settings.split_mode, main_gpu=0)


def sized(settings: EngineSettings, model_path: str) -> tuple[EngineSettings, Plan]:
    """`settings` with its "auto" slots, KV cells, threads and GPU layers decided from the machine,
    its GPUs and the model (outpost/sizing); NotEnoughMemory (a ValueError: exit 2) when explicit
    ones cannot fit."""

    existing_file(model_path)

    def given(value: object) -> int | None:
        return value if isinstance(value, int) else None

    gpus = _offload_targets(settings)
    asked = Asked(
        parallel=given(settings.parallel),
        ctx_size=given(settings.ctx_size),
        threads=given(settings.threads),
        n_ubatch=settings.ubatch_size,
        n_batch=settings.batch_size,
        # llama.cpp's own choice wherever layers can go to a GPU (sizing counts its buffers then).
        flash_attn=resolve_flash_attn(settings.flash_attn, 1 if gpus else 0),
        kv_unified=settings.kv_unified,
        gpu_layers=given(settings.n_gpu_layers),
    )
    plan = size_for_model(model_path, asked, gpus=gpus)
    update = {
        "parallel": plan.slots,
        "ctx_size": plan.n_ctx,
        "threads": plan.threads,
        "n_gpu_layers": plan.n_gpu_layers,
    }
    return settings.model_copy(update=update), plan


def start_engine(settings: EngineSettings, model_path: str, max_queue: int) -> Engine:
    """Load the model and start its engine thread."""
    return Engine(
        engine_config(settings, model_path),
        max_queue=max_queue,
        prefix_cache=settings.prefix_cache,
        idle_cache_cells=settings.cache_idle_cells,
        prefill_budget=settings.prefill_budget,
        prompt_waves=settings.prompt_waves,
        follow_up_wait_ms=settings.follow_up_wait,
        speculative=settings.speculative,
        draft_model_path=settings.model_draft,
    )


def start_local_backend(settings: EngineSettings, model_path: str, max_queue: int) -> LocalBackend:
    """The model loaded, its engine thread started, behind the seam as serve answers HTTP with it."""
    threads = settings.threads if isinstance(settings.threads, int) else 0
    return LocalBackend(
        start_engine(settings, model_path, max_queue),
        settings.embedding_model,
        threads,
        settings.slot_save_path,
        settings.reranker_path(model_path),
        LoraDefaults(settings.lora_adapters),
    )
