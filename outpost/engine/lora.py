"""LoRA adapters on a loaded model: loaded after it, applied to its context, freed before it.

llama.cpp applies adapters to a whole context (`llama_set_adapters_lora`), not per sequence: the
scheduler gives each step one set of (adapter, scale) (scheduler/lora_turns.py) and the runner
applies a set only when it differs from the last step's, since changing it makes llama.cpp build
its graph anew. Adapter ids are the positions of `--lora` files, as llama-server numbers them.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from outpost.engine.lib import llama, recent_problems
from outpost.messages import LoraScales


class LoraLoadError(RuntimeError):
    """llama.cpp refused an adapter file (not a LoRA GGUF, another architecture or shape)."""


class LoraAdapters:
    """The adapter handles of one model, in `--lora` order, and the settings its context has now."""

    def __init__(self, model: Any, paths: Sequence[str]) -> None:
        self._handles: list[Any] = []
        self.paths = tuple(paths)
        self._applied: LoraScales = ()
        for path in self.paths:
            handle = llama.llama_adapter_lora_init(model, path.encode())
            if not handle:
                self.free()
                why = recent_problems() or "not a LoRA adapter for this model"
                raise LoraLoadError(f"llama.cpp could not load the LoRA adapter {path}: {why}")
            self._handles.append(handle)

    def __len__(self) -> int:
        return len(self._handles)

    def apply(self, ctx: Any, lora: LoraScales) -> None:
        """Makes `ctx` decode with the adapters and scales of `lora` (ids index `paths`)."""
        if lora == self._applied:
            return
        n = len(lora)
        handles = (llama.llama_adapter_lora_p_ctypes * n)(*(self._handles[i] for i, _ in lora))
        scales = (ctypes.c_float * n)(*(scale for _, scale in lora))
        status = int(llama.llama_set_adapters_lora(ctx, handles, n, scales))
        if status != 0:
            raise RuntimeError(f"llama_set_adapters_lora failed with status {status}")
        self._applied = lora

    def free(self) -> None:
        """Frees every adapter (before the model; the context that used them must be gone)."""
        for handle in self._handles:
            llama.llama_adapter_lora_free(handle)
        self._handles = []
        self._applied = ()
