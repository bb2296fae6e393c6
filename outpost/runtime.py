"""Assembles a running engine from configuration: model + runner + scheduler + EngineCore + client.

This is the one place that knows how the layers plug together; the CLI and the server call
`start_engine()` and get back an `Engine` that tokenizes, renders chat prompts and streams tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from outpost.core import EngineClient, EngineCore
from outpost.engine.codec import LlamaCodec
from outpost.engine.config import EngineConfig, with_probed_kernels
from outpost.engine.kernel_probe import KernelChoice
from outpost.engine.model import LoadedModel
from outpost.engine.runner import ModelRunner
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.budget import Asked, PrefillBudget, budget_floor, resolve_prefill_budget

_log = logging.getLogger(__name__)


def stream_copy_min_tokens(cells_per_stream: int) -> int:
    """The shortest prefix worth copying across KV streams instead of evaluating it again.

    A cross-stream copy moves the whole stream, one memcpy: measured on SmolLM2-135M q4_0, 4.5 ms
    for 1024 cells and 28 ms for 8192 (~3.5 us a cell), against ~2 ms per prompt token on one
    thread (~1 ms on two). A prefix pays for the copy from about cells / 300 tokens; never below 16.
    """
    return max(16, cells_per_stream // 300)


class Engine:
    """A loaded model served by its own engine thread. `close()` stops the thread, then frees.

    prefill_budget: prompt tokens per step while other requests generate: `auto` (chosen from
    step times measured here at start, outpost/scheduler/budget.py), a number, or `off`/None.
    """

    def __init__(
        self,
        config: EngineConfig,
        max_queue: int = 64,
        prefix_cache: bool = True,
        idle_cache_cells: int = 0,
        prefill_budget: Asked | None = "auto",
    ) -> None:
        self.kernels: KernelChoice | None = None

        def build() -> tuple[Scheduler, ModelRunner]:
            probed, self.kernels = with_probed_kernels(config)
            self.model = LoadedModel(probed)
            try:
                self.runner = ModelRunner(self.model)
                model = self.model
                self.n_ctx_seq = min(model.n_ctx_train or model.n_ctx_seq, model.n_ctx_seq)
                self.prefill_budget = _prefill_budget(prefill_budget, self.runner, config.n_seq_max)
                self.scheduler_config = SchedulerConfig(
                    n_slots=config.n_seq_max,
                    # Per-slot streams: each slot's own cells bound it, the pool is their sum.
                    n_ctx=model.n_ctx if model.kv_unified else model.n_ctx_seq * config.n_seq_max,
                    n_ctx_seq=self.n_ctx_seq,
                    shared_kv=model.kv_unified,
                    max_queue=max_queue,
                    step_token_budget=model.n_batch,
                    prefill_budget=self.prefill_budget.tokens,
                    prefix_cache=prefix_cache,
                    idle_cache_cells=idle_cache_cells,
                    copy_min_tokens=1 if model.kv_unified else stream_copy_min_tokens(model.n_ctx_seq),
                )
                # The runner's own rendering of tokens: a resumed request's text is primed with it.
                return Scheduler(self.scheduler_config, self.model.vocab.token_to_piece), self.runner
            except BaseException:
                self.model.close()
                raise

        # Loaded on the engine thread, which frees it last too (see EngineCore.built_on_thread).
        self.core = EngineCore.built_on_thread(build, on_close=lambda: self.model.close())
        self.client = EngineClient(self.core)

    @property
    def vocab(self) -> Any:
        return self.model.vocab

    @property
    def codec(self) -> LlamaCodec:
        return self.model.codec

    def tokenize_prompt(self, text: str, add_special: bool = True) -> list[int]:
        """Tokenize a prompt, adding BOS only where the model wants it and the text lacks it."""
        return self.codec.tokenize_prompt(text, add_special)

    def render_chat(
        self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        return self.codec.render_chat(messages, add_generation_prompt=add_generation_prompt, **extra)

    def close(self) -> None:
        self.core.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prefill_budget(asked: Asked | None, runner: ModelRunner, n_slots: int) -> PrefillBudget:
    """The budget for `asked`, measured on this (the engine) thread where `auto` needs it."""
    config = runner.model.config
    floor = budget_floor(config.effective_n_ubatch, config.effective_flash_attn != "off")
    started = time.perf_counter()
    budget = resolve_prefill_budget(asked, n_slots, runner.model.n_batch, floor, runner.measure_step_times)
    took_ms = (time.perf_counter() - started) * 1e3
    _log.info("%s; chosen in %.0f ms", budget.describe(), took_ms)
    return budget
