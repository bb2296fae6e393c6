"""Slot choice, prefix reuse and eviction over the pool of slots, as memory ops.

Every method that changes a slot's KV returns the llama.cpp memory ops that make the real cache
match, and updates the slot at once: ops run in order before the step's decode, so a later
decision in the same step (another admission copying from this slot) sees the state it will find.
"""

from __future__ import annotations

from dataclasses import dataclass

from outpost.scheduler.output import MemoryOp, SeqCopy, SeqRemove
from outpost.scheduler.slots import Slot, cells_used, common_prefix_len


@dataclass(frozen=True)
class PrefixPlan:
    """Where a request goes and what KV it starts with.

    dst: the free slot it takes; reuse: tokens of its prompt already in KV after the plan;
    src: the slot to copy those from, or None when they are dst's own (or reuse is 0).
    """

    dst: Slot
    reuse: int
    src: Slot | None = None


class SlotPool:
    """All slots, an LRU clock and the origin counter for KV cell accounting."""

    def __init__(self, n_slots: int, prefix_cache: bool) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self.prefix_cache = prefix_cache
        self._tick = 0
        self._origins = 0
        self.n_busy = 0

    def touch(self, slot: Slot) -> None:
        """Marks the slot as just used (the LRU order of idle caches)."""
        self._tick += 1
        slot.last_used = self._tick

    def new_origin(self) -> int:
        self._origins += 1
        return self._origins

    def has_free(self) -> bool:
        return self.n_busy < len(self.slots)

    def cells_used(self) -> int:
        return cells_used(self.slots)

    def acquire(self, slot: Slot) -> None:
        slot.busy = True
        self.n_busy += 1
        self.touch(slot)

    def release(self, slot: Slot) -> None:
        """The request left; its KV stays as a prefix cache until the cells are needed."""
        slot.busy = False
        self.n_busy -= 1
        self.touch(slot)

    def plan(self, tokens: list[int]) -> PrefixPlan:
        """Picks the free slot for `tokens` and the prefix it can reuse (needs a free slot).

        The free slot sharing the longest prefix wins, ties (and no match) going to the least
        recently used one so warm caches live longest. If any other slot (busy ones too: their
        evaluated tokens are stable) holds a longer prefix, it is copied instead. At most
        len(tokens) - 1 tokens are reused: the last one must be evaluated to get logits.
        """
        free = [s for s in self.slots if not s.busy]
        if not self.prefix_cache:
            return PrefixPlan(min(free, key=_lru_key), 0)
        limit = len(tokens) - 1
        best = {s.seq_id: common_prefix_len(s.cached, tokens, limit) for s in self.slots}
        dst = min(free, key=lambda s: (-best[s.seq_id], s.last_used))
        own = best[dst.seq_id]
        src = max(self.slots, key=lambda s: (best[s.seq_id], s is not dst))
        if src is not dst and best[src.seq_id] > own:
            return PrefixPlan(dst, best[src.seq_id], src)
        return PrefixPlan(dst, own)

    def apply(self, plan: PrefixPlan) -> list[MemoryOp]:
        """Makes plan.dst hold exactly the plan's prefix; returns the ops that do it."""
        dst = plan.dst
        if plan.src is not None:
            dst.share_from(plan.src, plan.reuse)
            return [SeqRemove(dst.seq_id), SeqCopy(plan.src.seq_id, dst.seq_id, 0, plan.reuse)]
        if plan.reuse == 0:
            # Emitted even if we think the sequence is empty: cheap, and it heals any drift.
            dst.clear()
            return [SeqRemove(dst.seq_id)]
        dst.truncate(plan.reuse)
        return [SeqRemove(dst.seq_id, plan.reuse, -1)]

    def clear(self, slot: Slot) -> list[MemoryOp]:
        """Drops a sequence's whole KV."""
        slot.clear()
        return [SeqRemove(slot.seq_id)]

    def evict_lru(self, keep: tuple[Slot | None, ...] = ()) -> list[MemoryOp] | None:
        """Drops the least recently used idle cache (not one in `keep`); None if there is none."""
        idle = [s for s in self.slots if not s.busy and s.cached and s not in keep]
        if not idle:
            return None
        return self.clear(min(idle, key=_lru_key))

    def trim_idle(self, budget: int, keep: tuple[Slot | None, ...]) -> list[MemoryOp]:
        """Drops idle caches (oldest first) until the rest hold at most `budget` tokens.

        Without a prefix cache no idle cache can ever be reused, so all of them go."""
        if not self.prefix_cache:
            budget = 0
        idle = sorted(
            (s for s in self.slots if not s.busy and s.cached and s not in keep),
            key=_lru_key,
            reverse=True,
        )
        ops: list[MemoryOp] = []
        kept = 0
        for slot in idle:
            kept += len(slot.cached)
            if kept > budget:
                ops += self.clear(slot)
        return ops


def _lru_key(slot: Slot) -> int:
    return slot.last_used
