"""Putting drafts into a step's batch: which draft tokens the decode chunks carry, and which
requests the runner's draft model should draft for once the step is sampled.

Drafts ride on the decode chunks of the same step (one llama_decode for every stream), after
the one-token decodes have their cells and before prompt chunks take the rest of the token
budget: a draft never preempts, evicts or delays a decode, only uses room that is there.
"""

from __future__ import annotations

from typing import Protocol

from outpost.scheduler.config import SchedulerConfig
from outpost.scheduler.drafters import Drafter
from outpost.scheduler.output import BatchChunk, DraftAsk, RunnerOutput
from outpost.scheduler.request import RequestState
from outpost.scheduler.speculation import PROBE_EVERY, SpecState, catch_up_pays, may_probe, plan_drafts


class _Sched(Protocol):
    config: SchedulerConfig
    _drafters: dict[str, Drafter]
    _owner: list[RequestState | None]

    def _free_cells(self) -> int: ...


def _room(sched: _Sched, n_decoding: int) -> int:
    return min(sched.config.step_token_budget - n_decoding, sched._free_cells() - n_decoding)


def _cap(state: RequestState, spec: SpecState, n_ctx_seq: int) -> int:
    """The longest draft this request may verify: its n_max, its tokens left (one goes to the
    token sampled after the draft) and its context."""
    return min(spec.params.n_max, state.budget - state.n_generated - 1, n_ctx_seq - len(state.tokens) - 1)


def add_drafts(sched: _Sched, decoding: list[RequestState], chunks: list[BatchChunk]) -> int:
    """Extends the decode chunks (chunks[i] is decoding[i]'s) with drafts; returns tokens added."""
    config = sched.config
    candidates: list[tuple[SpecState, int]] = []
    drafts: list[tuple[int, list[int]]] = []
    for i, state in enumerate(decoding):
        spec = state.spec
        if spec is None:
            continue
        cap = _cap(state, spec, config.n_ctx_seq)
        if cap < max(1, spec.params.n_min):
            continue
        drafter = sched._drafters.get(spec.params.type)
        draft = drafter.propose(state.request_id, state.tokens, cap) if drafter is not None else spec.draft
        spec.draft = []
        offered = min(len(draft), cap)
        if offered < max(1, spec.params.n_min):
            continue
        candidates.append((spec, offered))
        drafts.append((i, draft))
    if not candidates:
        return 0
    ks = plan_drafts(
        candidates,
        len(decoding),
        config.spec_token_cost,
        _room(sched, len(decoding)),
        config.draft_token_cost,
    )
    added = 0
    # A probe verifies a draft that is already made: it costs the step one token's place.
    probing = may_probe(len(decoding), config.spec_token_cost)
    for (i, draft), k, (spec, _) in zip(drafts, ks, candidates, strict=True):
        if k == 0:
            spec.idle_steps += 1
            if not probing or spec.idle_steps < PROBE_EVERY or _room(sched, len(decoding)) - added < 1:
                continue
            k = 1
        spec.idle_steps = 0
        chunk = chunks[i]
        chunks[i] = BatchChunk(chunk.seq_id, chunk.tokens + draft[:k], chunk.start_pos, True, k)
        added += k
    return added


def draft_asks(sched: _Sched, chunks: list[BatchChunk], n_decoding: int) -> list[DraftAsk]:
    """Asks the draft model for the requests that sample this step and draft with it, as long a
    draft as the planner would take from them if the next step looks like this one."""
    owners = sched._owner
    candidates: list[tuple[SpecState, int]] = []
    states: list[tuple[int, RequestState]] = []
    for chunk in chunks:
        state = owners[chunk.seq_id]
        if not chunk.sample or state is None or state.spec is None or state.spec.params.type != "draft":
            continue
        # After this step the request holds 1 + n_draft more tokens at most; aim at the common case.
        cap = _cap(state, state.spec, sched.config.n_ctx_seq) - 1
        if cap >= max(1, state.spec.params.n_min):
            candidates.append((state.spec, cap))
            states.append((chunk.seq_id, state))
    if not candidates:
        return []
    config = sched.config
    # The next step decodes every request that samples in this one (those still reading their
    # prompts join later): drafts are planned for that step, and probes allowed as it allows.
    n_next = max(n_decoding, sum(1 for chunk in chunks if chunk.sample), 1)
    ks = plan_drafts(
        candidates, n_next, config.spec_token_cost, config.step_token_budget, config.draft_token_cost
    )
    asks = []
    probing = may_probe(n_next, config.spec_token_cost, config.draft_token_cost)
    for (seq_id, state), k, (spec, cap) in zip(states, ks, candidates, strict=True):
        # A new request is due a probe (SpecState.idle_steps): the step that samples its first
        # token asks the draft model where reading the prompt can pay, not PROBE_EVERY steps
        # later, when the read would fall between two of the request's tokens.
        if k == 0:
            spec.idle_steps += 1
            if not probing or spec.idle_steps < PROBE_EVERY or not _catch_up_pays(config, state, spec):
                continue
            k = 1
        spec.draft_asked = True
        asks.append(DraftAsk(seq_id, state.request_id, state.tokens, min(k, cap)))
    return asks


def _catch_up_pays(config: SchedulerConfig, state: RequestState, spec: SpecState) -> bool:
    """A request's first ask makes the draft model read its whole history (the prompt, at the first
    token; more if it was not asked while other streams decoded): only where that can pay. The
    read's time counts as much at the first token as later (it delays that token, and every other
    stream's step). After a read, what is new is short."""
    if spec.draft_asked:
        return True
    return catch_up_pays(
        len(state.tokens),
        state.budget - state.n_generated,
        config.spec_token_cost,
        config.draft_token_cost,
        config.draft_read_cost,
    )


def keep_draft(state: RequestState, seq_id: int, result: RunnerOutput) -> None:
    """A draft-model request's draft for its next step: what the runner drafted after this step's
    tokens (a verified draft's accepted tokens and correction included), or none."""
    if state.spec is not None and state.spec.params.type == "draft":
        state.spec.draft = result.drafts.get(seq_id, [])
