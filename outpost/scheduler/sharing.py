"""Sharing a prompt prefix that another request is still computing (shared prefixes, cold).

`SlotPool.plan` reuses prefixes already in KV. When requests that share a long system prompt arrive
together at a fresh server none is there yet, and each would evaluate the whole prompt: 8 x 540
tokens instead of 540 + 8 x 40. So admission also looks at the running requests still prefilling.
If one of them (the *source*) is computing a longer prefix of the new prompt than any slot holds,
at least `copy_min` tokens, the new request *awaits* it (`RequestState.awaiting`): it takes its slot
as usual (FCFS, nobody overtakes) but gets no prompt chunks, which leaves the step's prompt budget
to the source and so speeds the whole group up. Once the source's KV covers the prefix it is copied
in (SeqRemove + SeqCopy, as any prefix copy) and only the rest is prefilled. Two requests admitted
in the same step count too: the first is computing from that step on.

If the source leaves first (finished, aborted, expired, preempted), the waiter decides again with
what is there at that moment: the source's finished cache, another source, or computing the prefix
itself. A request that awaits is never a source, so waits form no chains and no cycles. A source
decodes under the waiter's LoRA settings, or it is none (its KV would be another adapter's).
"""

from __future__ import annotations

from collections.abc import Iterable

from outpost.messages import LoraScales
from outpost.scheduler.pool import PrefixPlan, SlotPool
from outpost.scheduler.request import RequestState
from outpost.scheduler.slots import Slot, common_prefix_len

Wait = tuple[RequestState, int]  # (source, prefix length): RequestState.awaiting


def source_to_await(
    pool: SlotPool, plan: PrefixPlan, tokens: list[int], running: Iterable[RequestState], lora: LoraScales
) -> Wait | None:
    """The running request computing the longest prefix of `tokens`, if it beats `plan`.

    A source is prefilling, awaits nobody, and its KV does not hold the shared prefix yet (if it
    did, `plan` would copy it). Worth awaiting: longer than what `plan` reuses and at least the
    pool's `copy_min` (a shorter prefix is cheaper to evaluate again than to copy)."""
    if not pool.prefix_cache:
        return None
    best: Wait | None = None
    floor = max(plan.reuse, pool.copy_min - 1)
    limit = len(tokens) - 1  # as `plan`: the last prompt token is evaluated for its logits
    for state in running:
        if state.prefilled or state.slot is None or state.awaiting is not None or state.lora != lora:
            continue
        n = common_prefix_len(state.tokens, tokens, limit)
        if n > max(floor, len(state.slot.cached)) and (best is None or n > best[1]):
            best = (state, n)
    return best


def next_move(
    pool: SlotPool,
    tokens: list[int],
    wait: Wait,
    dst: Slot,
    running: Iterable[RequestState],
    lora: LoraScales,
) -> PrefixPlan | Wait:
    """What a request awaiting `wait` in slot `dst` does this step: a plan to apply now (the prefix
    is ready to copy, or the wait is over), or the wait to go on with (maybe on another source).

    The waiter itself must still be marked as awaiting, so that it is not its own source."""
    src, n = wait
    if src.slot is not None and len(src.slot.cached) >= n:
        return PrefixPlan(dst, n, src.slot)
    if src.slot is not None and src.awaiting is None:
        return wait  # still computing it
    # The source left (or came back after a preemption to await another): decide again.
    plan = pool.plan_for(dst, tokens, lora)
    return source_to_await(pool, plan, tokens, running, lora) or plan
