"""Assembles a running engine from configuration: model + executor + scheduler + EngineCore + client.

This is the one place that knows how the layers plug together; the CLI and the server call
`start_engine()` and get back an `Engine` that tokenizes, renders chat prompts and streams tokens.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import Any

from outpost.engine.codec import LlamaCodec
from outpost.engine.config import EngineConfig, with_probed_kernels
from outpost.engine.draft_model import DraftModel
from outpost.engine.executor import ModelRunner
from outpost.engine.kernel_probe import KernelChoice
from outpost.engine.model import LoadedModel
from outpost.engine.step_timing import VERIFY_DRAFT
from outpost.messages import SpecParams
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.budget import Asked, PrefillBudget, StepTimes, budget_floor, resolve_prefill_budget
from outpost.scheduler.speculation import SpecCosts, token_cost_from
from outpost.serving.engine_core import EngineClient, EngineCore

_log = logging.getLogger(__name__)

# Where the draft model's prompt read cannot be timed: what a token read costs, as a share of a
# draft step. Below the share measured for a 135M draft (docs/performance.md, "Figures behind
# the code's constants"): larger models read a token in a smaller share of their step.
UNMEASURED_READ_SHARE = 0.25


def stream_copy_min_tokens(cells_per_stream: int) -> int:
    """The shortest prefix worth copying across KV streams instead of evaluating it again.

    A cross-stream copy moves the whole stream, one memcpy, at about 1/300 of a prompt token's
    cost per cell (docs/performance.md, "Figures behind the code's constants"): a prefix pays for
    the copy from about cells / 300 tokens; never below 16.
    """
    return max(16, cells_per_stream // 300)


class Engine:
    """A loaded model served by its own engine thread. `close()` stops the thread, then frees.

    prefill_budget: prompt tokens per step while other requests generate: `auto` (chosen from
    step times measured here at start, outpost/scheduler/budget.py), a number, or `off`/None.
    prompt_waves: SchedulerConfig.prompt_waves (0: off).
    follow_up_wait_ms: the most milliseconds to wait after a request ends for a closed loop's next
    request before the next step (outpost/serving/follow_ups.py; 0: off).
    """

    def __init__(
        self,
        config: EngineConfig,
        max_queue: int = 64,
        prefix_cache: bool = True,
        idle_cache_cells: int = 0,
        prefill_budget: Asked | None = "auto",
        prompt_waves: int = 0,
        follow_up_wait_ms: float = 0.0,
        speculative: SpecParams | None = None,
        draft_model_path: str | None = None,
        ngram_simple: tuple[int, int] = (12, 48),
    ) -> None:
        self.kernels: KernelChoice | None = None
        self.spec_costs: SpecCosts | None = None  # speculation's prices, where it is on by default
        spec = speculative or SpecParams()
        # On the CPU a prompt token costs about the same alone or beside others (prefill.py).
        serial_prompts = config.n_gpu_layers == 0

        def build() -> tuple[Scheduler, ModelRunner]:
            probed, self.kernels = with_probed_kernels(config)
            self.model = LoadedModel(probed)
            try:
                draft = _load_draft(probed, draft_model_path, self.model.vocab.n_tokens)
                # Requests may ask for n-gram speculation whatever the default: the runner always
                # verifies drafts; only the cost model's measurement depends on the default.
                self.runner = ModelRunner(self.model, draft, speculating=True)
                model = self.model
                self.n_ctx_seq = min(model.n_ctx_train or model.n_ctx_seq, model.n_ctx_seq)
                self.prefill_budget = _prefill_budget(prefill_budget, self.runner, config.n_seq_max)
                costs = _spec_costs(self.runner, self.prefill_budget, spec.enabled)
                self.spec_costs = costs if spec.enabled else None
                self.scheduler_config = SchedulerConfig(
                    n_slots=config.n_seq_max,
                    # Per-slot streams: each slot's own cells bound it, the pool is their sum.
                    n_ctx=model.n_ctx if model.kv_unified else model.n_ctx_seq * config.n_seq_max,
                    n_ctx_seq=self.n_ctx_seq,
                    shared_kv=model.kv_unified,
                    max_queue=max_queue,
                    step_token_budget=model.n_batch,
                    prefill_budget=self.prefill_budget.tokens,
                    serial_prompts=serial_prompts,
                    prompt_waves=prompt_waves,
                    prefix_cache=prefix_cache,
                    idle_cache_cells=idle_cache_cells,
                    copy_min_tokens=1 if model.kv_unified else stream_copy_min_tokens(model.n_ctx_seq),
                    speculative=spec,
                    spec_token_cost=costs.token,
                    draft_model=draft is not None,
                    draft_token_cost=costs.draft,
                    draft_read_cost=costs.read,
                    ngram_simple=ngram_simple,
                )
                # The runner's own rendering of tokens: a resumed request's text is primed with it.
                return Scheduler(self.scheduler_config, self.model.vocab.token_to_piece), self.runner
            except BaseException:
                self.model.close()
                raise

        # Loaded on the engine thread, which frees it last too (see EngineCore.built_on_thread).
        # The wait spares a prompt a serial prompt step (follow_ups.py): with serial prompts only.
        follow_up_wait = follow_up_wait_ms / 1000.0 if serial_prompts else 0.0
        self.core = EngineCore.built_on_thread(
            build, on_close=lambda: self.model.close(), follow_up_wait=follow_up_wait
        )
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


def _load_draft(config: EngineConfig, path: str | None, n_vocab: int) -> DraftModel | None:
    """The draft model (-md), with a context shaped as the target's, or None."""
    if path is None:
        return None
    # The target's adapters are for its tensors: the draft model drafts without them.
    draft_config = config.model_copy(update={"model_path": path, "lora_adapters": ()})
    draft = DraftModel(LoadedModel(draft_config), n_vocab)
    _log.info("draft model %s loaded", path)
    return draft


def _spec_costs(runner: ModelRunner, budget: PrefillBudget, enabled: bool) -> SpecCosts:
    """Speculation's prices from step times measured here, where speculation is on by default
    (else the defaults: a request that asks for it gets the rough model). A draft token's price is
    timed as a verification is (step_timing.measure_verify_times), prompt chunks where that fails."""
    default = SchedulerConfig()
    token, draft_cost, read_cost = default.spec_token_cost, default.draft_token_cost, default.draft_read_cost
    has_draft = runner.draft_model is not None
    if not enabled:
        return SpecCosts(token, draft_cost, read_cost, has_draft, "defaults: no speculation unless asked")
    times = budget.times or runner.measure_step_times()
    step_s, verify_s = runner.measure_verify_times()
    notes = []
    if 0 < step_s < verify_s < math.inf:
        token = token_cost_from(step_s, (verify_s - step_s) / VERIFY_DRAFT)
    elif times.believable():
        token = token_cost_from(times.decode_s, times.per_token_s)
        notes.append("verification not timed: a draft token priced from prompt chunks")
    else:
        notes.append("step times not believable: default draft token")
    if runner.draft_model is not None and times.decode_s > 0:
        draft = _draft_step_times(runner.draft_model)
        # Its step beside the target's, both after the same history: attention over it costs the
        # small model about what it costs the large one, so at position 0 a draft step looks cheap.
        draft_s = runner.draft_model.measure_step_at_depth()
        if 0 < step_s < math.inf and 0 < draft_s < math.inf:
            draft_cost = min(max(draft_s / step_s, 0.01), 2.0)
        else:
            draft_cost = min(max(draft.decode_s / times.decode_s, 0.01), 2.0)
        if draft.believable():
            read_cost = min(max(draft.per_token_s / times.decode_s, 0.001), 2.0)
        else:
            # Dearer than the default: a read priced too low stalls every stream for nothing.
            read_cost = max(read_cost, draft_cost * UNMEASURED_READ_SHARE)
            notes.append(f"draft read time not believable: {UNMEASURED_READ_SHARE} of a draft step")
    costs = SpecCosts(token, draft_cost, read_cost, has_draft, "; ".join(notes) or "measured")
    _log.info("%s", costs.describe())
    return costs


def _draft_step_times(draft: DraftModel, tries: int = 3) -> StepTimes:
    """The draft model's step times, measured again (up to `tries` times) until believable."""
    for _ in range(tries):
        times = draft.measure_step_times()
        if times.believable():
            break
    return times


def _prefill_budget(asked: Asked | None, runner: ModelRunner, n_slots: int) -> PrefillBudget:
    """The budget for `asked`, measured on this (the engine) thread where `auto` needs it."""
    config = runner.model.config
    floor = budget_floor(config.effective_n_ubatch, config.effective_flash_attn != "off")
    started = time.perf_counter()
    budget = resolve_prefill_budget(asked, n_slots, runner.model.n_batch, floor, runner.measure_step_times)
    took_ms = (time.perf_counter() - started) * 1e3
    _log.info("%s; chosen in %.0f ms", budget.describe(), took_ms)
    return budget
