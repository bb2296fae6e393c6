"""The pipeline's last steps, the same for every protocol: context and limits -> submit -> outcomes.

A protocol turns its body into a `Submission`; `submit` checks each prompt against the backend's
context and starts one `GenerateRequest` per prompt and choice (admission refusals are ApiErrors
before any reply byte); `outcomes` waits for a reply that is not streamed.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from starlette.requests import Request

from outpost.api.pipeline import mapping
from outpost.api.pipeline.generation import Generation, Outcome, outcome_error, start_all, wait_outcomes
from outpost.api.record import record_of
from outpost.api.state import ServerState
from outpost.backend import InferenceBackend
from outpost.messages import GenerateRequest, LoraScales, SamplingParams, SpecRequest


@dataclass
class Submission:
    """A protocol's request as the pipeline runs it."""

    backend: InferenceBackend
    prompts: list[list[int]]  # token lists, one per prompt
    requested: int | None  # the output budget asked for; None: the default; -1: what the context leaves
    default_budget: int
    sampling: SamplingParams
    stops: tuple[str, ...]
    names: mapping.Names
    prefix: str  # the request id's
    choices: int = 1  # per prompt (`n`): requests on one prompt share its KV through the prefix cache
    spec: SpecRequest | None = None
    slot: int = -1  # llama-server's id_slot: the slot every prompt runs in (-1: any)
    progress: bool = False  # llama-server's return_progress: events as the prompt is read
    lora: LoraScales | None = None  # llama-server's per-request lora (None: the server's scales)
    arrival: float = field(default_factory=time.monotonic)


def capped(requested: int | None, cap: int) -> int | None:
    """An explicit budget over the server's `-n` is cut to it, as llama-server's (no budget, or -1,
    is cut after resolving); cap -1: no cap."""
    return cap if cap > 0 and requested is not None and requested > cap else requested


async def submit(state: ServerState, request: Request, sub: Submission) -> tuple[str, list[Generation]]:
    """(request id, generations: prompt i's choice j at i * choices + j), every one admitted."""
    cfg = state.config
    n_ctx = sub.backend.n_ctx_seq
    requested = capped(sub.requested, cfg.n_predict)
    budgets = [
        mapping.resolve_max_tokens(len(tokens), requested, n_ctx, sub.default_budget, sub.names)
        for tokens in sub.prompts
    ]
    if cfg.n_predict > 0:
        budgets = [min(b, cfg.n_predict) for b in budgets]
    rid = f"{sub.prefix}-{uuid.uuid4().hex}"
    record_of(request).id = rid
    total = len(sub.prompts) * sub.choices
    gens = []
    for i, (tokens, budget) in enumerate(zip(sub.prompts, budgets, strict=True)):
        for j in range(sub.choices):
            req = GenerateRequest(
                prompt_tokens=tokens,
                max_tokens=budget,
                sampling=mapping.choice_sampling(sub.sampling, j),
                stop=sub.stops,
                request_id=rid if total == 1 else f"{rid}-{i * sub.choices + j}",
                deadline=sub.arrival + cfg.request_timeout,
                arrival_time=sub.arrival,
                speculative=sub.spec,
                slot=sub.slot,
                progress=sub.progress,
                lora=sub.lora,
            )
            gens.append(Generation(sub.backend, req, state.metrics, sub.names))
    await start_all(gens)
    return rid, gens


async def outcomes(
    state: ServerState, request: Request, gens: list[Generation], prompts: list[str]
) -> list[Outcome]:
    """Every generation's outcome (a client that hangs up aborts them: a 499), each recorded with
    its prompt text; the first that failed raises its error."""
    cfg = state.config
    outs = await wait_outcomes(request, gens)
    for text, out in zip(prompts, outs, strict=True):
        record_of(request).add_outcome(out, text, cfg.log_prompts)
    for out in outs:
        if (err := outcome_error(out, cfg.request_timeout)) is not None:
            raise err
    return outs
