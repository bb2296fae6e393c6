"""Engine configuration: how a GGUF is loaded and how its llama.cpp context is shaped."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from outpost.engine.cpu_probe import ONE_TOKEN_MAX_SLOTS, WeightLayout, choose_layout
from outpost.engine.kernel_probe import KernelChoice, kernel_choice, probe_width
from outpost.messages import SplitMode


def available_cpus() -> int:
    """CPUs this process may keep busy: the affinity mask or a container's CPU quota, whichever is
    smaller (outpost/sizing). Not 'physical cores': on a 2-vCPU VM that may read 1 and halve speed."""
    from outpost.sizing.machine import read_cores

    return read_cores().count


def resolve_flash_attn(asked: str, n_gpu_layers: int) -> Literal["on", "off", "auto"]:
    """Flash attention as llama.cpp gets it. `auto` means llama.cpp's auto (on where supported)
    with GPU layers, and off on the CPU: llama.cpp's CPU kernel works in tiles of 64 query rows and
    takes a row at a time below that, so every decode step (one row per sequence) and every prompt
    chunk shorter than 64 per KV stream pays for it. Measured here (135M q4_0, 2 threads, 8 KV
    streams): decode at depth 128 283 vs 236 tok/s with it off vs on, at depth 600 192 vs 102;
    8 requests sharing a 511-token system prompt (40-token tails, one stream each) 1.4 vs 2.9 s to
    their first tokens. The plain attention it replaces keeps the scores for every attended cell,
    which sizing counts (outpost/sizing/plan.py)."""
    if asked == "auto":
        return "off" if n_gpu_layers == 0 else "auto"
    return "on" if asked == "on" else "off"


def with_probed_kernels(config: EngineConfig) -> tuple[EngineConfig, KernelChoice | None]:
    """`config` with its `auto` flash attention, weight layout and KV layout decided by this
    machine's kernel probe (kernel_probe.py) at its slot count; unchanged (and None) with GPU
    layers, with nothing left on auto, or with the probe turned off."""
    auto = [f for f in ("flash_attn", "repack", "kv_unified") if getattr(config, f) == "auto"]
    if config.n_gpu_layers != 0 or not auto:
        return config, None
    choice = kernel_choice(probe_width(config.n_seq_max))
    if choice is None:
        return config, None
    update: dict[str, str] = {}
    if "flash_attn" in auto:
        update["flash_attn"] = "on" if choice.flash_attn else "off"
    # "repacked" stays auto: cpu_probe.choose_layout's AMX rules. The probe compared layouts for
    # many slots; AMX's one-token layout for 1-2 slots (where its tiles fault) is not its question.
    one_token = choice.family == "intel-amx-fault" and config.n_seq_max <= ONE_TOKEN_MAX_SLOTS
    if "repack" in auto and choice.layout == "plain" and not one_token:
        update["repack"] = "off"
    if "kv_unified" in auto and choice.kv_unified:
        update["kv_unified"] = "on"  # a stream per slot stays auto: one pool for one slot or AMX
    return config.model_copy(update=update), choice


class EngineConfig(BaseModel):
    """Load and context parameters; field names follow llama.cpp's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str
    n_ctx: int = Field(
        0, ge=0, description="total KV cells for all slots; 0 = the trained context, at most 8192"
    )
    n_batch: int = Field(512, ge=1, description="max tokens in one llama_decode")
    n_ubatch: int = Field(512, ge=1, description="physical micro-batch")
    n_seq_max: int = Field(4, ge=1, le=256, description="slots (sequence ids) in one context")
    n_threads: int = Field(default_factory=available_cpus, ge=1)
    n_threads_batch: int | None = Field(None, ge=1, description="prefill threads; None = n_threads")
    n_gpu_layers: int = Field(
        0,
        ge=-1,
        description="layers offloaded to GPU; -1 = all (sizing resolves -ngl to -1 when it covers all)",
    )
    split_mode: SplitMode = "layer"
    main_gpu: int = Field(0, ge=0)
    tensor_split: tuple[float, ...] = ()
    flash_attn: Literal["auto", "on", "off"] = "auto"
    kv_cache_type: Literal["f16", "q8_0", "f32"] = Field(
        "f16", description="K/V cache element type; f32 (with flash_attn off) for exact numerical checks"
    )
    repack: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's extra CPU weight layouts (repacked q4_0 on ARM, AMX on Intel); "
        "auto = on; where AMX tiles fault, one token per micro-batch for <= 2 slots, else the "
        "repacked layout without AMX (see cpu_probe.py)",
    )
    kv_unified: Literal["auto", "on", "off"] = Field(
        "auto",
        description="a stream of n_ctx / n_seq_max KV cells per slot (auto, off) or one pool of "
        "cells for all slots (on); see effective_kv_unified",
    )
    backend_sampling: Literal["auto", "on", "off"] = Field(
        "auto",
        description="llama.cpp's backend sampling for the chains it does exactly; auto = on with "
        "GPU layers (see effective_backend_sampling)",
    )
    use_mmap: bool = True
    use_mlock: bool = False
    chat_template: str | None = Field(None, description="jinja template overriding the GGUF's own")
    lora_adapters: tuple[str, ...] = Field(
        (), description="LoRA adapter GGUFs loaded after the model (ids 0, 1, ... in this order)"
    )

    @property
    def effective_flash_attn(self) -> Literal["on", "off", "auto"]:
        """What llama.cpp gets: `auto` is off when the model runs on the CPU (see resolve_flash_attn)."""
        return resolve_flash_attn(self.flash_attn, self.n_gpu_layers)

    @property
    def weight_layout(self) -> WeightLayout:
        return choose_layout(self.repack, self.n_seq_max, self.n_gpu_layers)

    @property
    def use_extra_bufts(self) -> bool:
        """llama.cpp's own extra-layout switch; "repacked-no-amx" names its tensors instead."""
        return self.weight_layout in ("repacked", "amx-gemv")

    @property
    def use_repack_overrides(self) -> bool:
        """CPU_REPACK named tensor by tensor (repack_overrides.py); never with GPU layers, whose
        weights the overrides would pin to the CPU."""
        return self.weight_layout == "repacked-no-amx" and self.n_gpu_layers == 0

    @property
    def effective_kv_unified(self) -> bool:
        """A KV stream per slot unless asked otherwise (`auto`, `off`); one pool with `on`.

        Per-slot streams decode faster once several slots are busy (no token attends over other
        slots' cells: 135M, 8 sequences at depth 128, raw llama_decode: 297 vs 241 tok/s) and keep
        every idle cache for free. llama.cpp splits a step's batch at every gap in the busy seq
        ids (one pass over the weights per run of consecutive ids), so the scheduler keeps busy
        slots at the lowest ids (SchedulerConfig.shared_kv). One pool always with the one-token
        AMX layout (llama.cpp crashes as soon as two sequences decode in separate streams there)
        and with one slot (nothing to separate).
        """
        if self.weight_layout == "amx-gemv" or self.n_seq_max == 1:
            return True
        return self.kv_unified == "on"

    @property
    def effective_backend_sampling(self) -> bool:
        """Sample in the graph? `auto`: where layers are offloaded (the logits then stay on the card,
        only token ids come back); not on the CPU, where the graph's sampler runs on the same cores
        as the host sampler (outpost/engine/host_sampling.py) and saves no copy across a bus."""
        if self.backend_sampling == "auto":
            return self.n_gpu_layers != 0
        return self.backend_sampling == "on"

    @property
    def effective_n_ubatch(self) -> int:
        """The micro-batch llama.cpp gets: 1 where only AMX's one-token kernel is safe."""
        return 1 if self.weight_layout == "amx-gemv" else min(self.n_ubatch, self.n_batch)

    @field_validator("model_path")
    @classmethod
    def _model_exists(cls, path: str) -> str:
        if not os.path.isfile(path):
            raise ValueError(f"model file not found: {path} (give a .gguf path with -m)")
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ValueError(f"{path} is not a GGUF file (convert it first: outpost convert)")
        return path
