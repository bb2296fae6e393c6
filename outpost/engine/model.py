"""A loaded GGUF model and its llama.cpp context, freed in the right order.

`LoadedModel` owns the native handles: the model, its LoRA adapters (lora.py), the context made
from it, and (through `Vocab`) a view of the model's vocabulary. `close()` frees the context, then
the adapters, then the model; nothing else in Outpost frees them.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import numpy as np
import numpy.typing as npt

from outpost.engine.codec import LlamaCodec, read_metadata
from outpost.engine.config import EngineConfig
from outpost.engine.lib import CPU_BUILD, ensure_backend, llama, recent_problems
from outpost.engine.logits import logits_row
from outpost.engine.lora import LoraAdapters, LoraLoadError
from outpost.engine.repack_overrides import RepackOverrides
from outpost.engine.vocab import Vocab
from outpost.messages import SPLIT_MODES, LoraScales

_log = logging.getLogger(__name__)

_FLASH_ATTN = {
    "auto": llama.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}
DEFAULT_MAX_CTX = 8192
_KV_TYPES = {"f16": llama.GGML_TYPE_F16, "q8_0": llama.GGML_TYPE_Q8_0, "f32": llama.GGML_TYPE_F32}


class ModelLoadError(RuntimeError):
    """llama.cpp refused the file or the context parameters."""


class LoadedModel:
    """A model plus one context with `n_seq_max` sequences, over one KV pool or a stream each."""

    def __init__(self, config: EngineConfig) -> None:
        ensure_backend()
        self.config = config
        self._model: Any = None
        self._ctx: Any = None
        self._tensor_split: Any = None  # keeps the float array alive while llama.cpp may read it
        self._overrides: RepackOverrides | None = None  # the same, for the tensor override array
        self.adapters: LoraAdapters | None = None
        self._model = llama.llama_model_load_from_file(config.model_path.encode(), self._model_params())
        if not self._model:
            raise ModelLoadError(
                f"llama.cpp could not load {config.model_path}: {recent_problems() or 'unknown error'}"
            )
        try:
            self.vocab = Vocab(llama.llama_model_get_vocab(self._model))
            self.n_ctx_train = int(llama.llama_model_n_ctx_train(self._model))
            try:
                self.adapters = LoraAdapters(self._model, config.lora_adapters)
            except LoraLoadError as exc:
                raise ModelLoadError(str(exc)) from None
            self._ctx = llama.llama_init_from_model(self._model, self._context_params())
            if not self._ctx:
                raise ModelLoadError(
                    f"llama.cpp could not create a context: {recent_problems() or 'out of memory?'}"
                )
            # llama.cpp may round n_ctx up and clamp n_batch to it: plan with what it really chose.
            self.n_ctx = int(llama.llama_n_ctx(self._ctx))
            self.n_batch = int(llama.llama_n_batch(self._ctx))
            self.kv_unified = config.effective_kv_unified
            self.n_ctx_seq = int(llama.llama_n_ctx_seq(self._ctx))  # cells one sequence may use
            self.memory = llama.llama_get_memory(self._ctx)
            self.codec = LlamaCodec(
                self.vocab, self.config.chat_template or self.metadata("tokenizer.chat_template")
            )
        except BaseException:
            self.close()
            raise

    def _model_params(self) -> Any:
        cfg = self.config
        params = llama.llama_model_default_params()
        params.n_gpu_layers = 2**31 - 1 if cfg.n_gpu_layers < 0 else cfg.n_gpu_layers
        params.split_mode = SPLIT_MODES.index(cfg.split_mode)  # llama.h numbers them in this order
        params.main_gpu = cfg.main_gpu
        params.use_extra_bufts = cfg.use_extra_bufts
        if cfg.use_repack_overrides:
            self._overrides = RepackOverrides(cfg.model_path)
            self._overrides.apply(params)
        if cfg.use_mlock:
            params.load_mode = (
                llama.LLAMA_LOAD_MODE_MMAP_MLOCK if cfg.use_mmap else llama.LLAMA_LOAD_MODE_MLOCK
            )
        else:
            params.load_mode = llama.LLAMA_LOAD_MODE_MMAP if cfg.use_mmap else llama.LLAMA_LOAD_MODE_NONE
        if cfg.tensor_split:
            n = int(llama.llama_max_devices())
            values = list(cfg.tensor_split)[:n] + [0.0] * max(0, n - len(cfg.tensor_split))
            self._tensor_split = (ctypes.c_float * n)(*values)
            params.tensor_split = self._tensor_split
        return params

    def _context_params(self) -> Any:
        cfg = self.config
        params = llama.llama_context_default_params()
        # 0: the model's trained context, capped so a 128k-context model does not allocate 128k cells.
        params.n_ctx = cfg.n_ctx or min(self.n_ctx_train, DEFAULT_MAX_CTX)
        params.n_batch = cfg.n_batch
        params.n_ubatch = cfg.effective_n_ubatch
        params.n_seq_max = cfg.n_seq_max
        params.n_threads = cfg.n_threads
        params.n_threads_batch = cfg.n_threads_batch or cfg.n_threads
        params.flash_attn_type = _FLASH_ATTN[cfg.effective_flash_attn]
        params.type_k = _KV_TYPES[cfg.kv_cache_type]
        params.type_v = _KV_TYPES[cfg.kv_cache_type]
        # Unified: one pool of cells for all slots, shared prefixes cost no extra memory, but every
        # token attends over every slot's cells. Else one stream of n_ctx / n_seq_max cells per slot.
        params.kv_unified = cfg.effective_kv_unified
        params.no_perf = True
        return params

    @property
    def ctx(self) -> Any:
        return self._ctx

    @property
    def model(self) -> Any:
        return self._model

    def apply_lora(self, lora: LoraScales) -> None:
        """The context decodes with these adapter settings from now on (ids: --lora's order)."""
        if self.adapters is not None:
            self.adapters.apply(self._ctx, lora)

    def metadata(self, key: str) -> str | None:
        """A GGUF metadata value as text, or None when the key is absent."""
        return read_metadata(self._model, key)

    def output_logits(self, batch_index: int) -> npt.NDArray[np.float32]:
        """A copy of the logits row the last decode produced for batch position `batch_index`."""
        return logits_row(self._ctx, batch_index, self.vocab.n_tokens).copy()

    def describe(self) -> dict[str, Any]:
        """Facts a server or CLI shows about the model."""
        buf = ctypes.create_string_buffer(256)
        llama.llama_model_desc(self._model, buf, 256)
        return {
            "description": buf.value.decode(errors="replace"),
            "n_params": int(llama.llama_model_n_params(self._model)),
            "size_bytes": int(llama.llama_model_size(self._model)),
            "n_ctx_train": self.n_ctx_train,
            "n_ctx": self.n_ctx,
            "n_vocab": self.vocab.n_tokens,
            "architecture": self.metadata("general.architecture"),
            "name": self.metadata("general.name"),
            "model_path": self.config.model_path,
            "cpu_build": CPU_BUILD.describe(),
        }

    def close(self) -> None:
        """Free the context, then the model. Safe to call twice."""
        if self._ctx:
            llama.llama_free(self._ctx)
            self._ctx = None
        if self.adapters is not None:
            self.adapters.free()
            self.adapters = None
        if self._model:
            llama.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
