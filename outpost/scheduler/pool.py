"""Slot choice, prefix reuse and eviction over the pool of slots, as memory ops.

Every method that changes a slot's KV returns the llama.cpp memory ops that make the real cache
match, and updates the slot at once: ops run in order before the step's decode, so a later
decision in the same step (another admission copying from this slot) sees the state it will find.
"""

from __future__ import annotations

from dataclasses import dataclass

from outpost.messages import LoraScales
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
    """All slots, an LRU clock and the origin counter for KV cell accounting.

    compact: keep busy slots in runs of consecutive ids (a KV stream per slot: llama.cpp decodes
    each run of consecutive busy seq ids in its own pass over the weights). A new request takes
    the free slot that adds no run (next to busy ones, or joining two runs), and among those the
    one whose idle cache loses the least (its own prefix reused, else the least recently used);
    a longer prefix held elsewhere is copied in. Otherwise (one KV pool) the free slot with the
    longest own prefix wins among those that lose no cached token (empty, or wholly reused), else
    among all, ties to the least recently used.
    copy_min: the shortest prefix worth copying from another slot (with a stream per slot a copy
    moves the whole stream, whatever the prefix's length).
    """

    def __init__(self, n_slots: int, prefix_cache: bool, compact: bool = False, copy_min: int = 1) -> None:
        self.slots = [Slot(i) for i in range(n_slots)]
        self.prefix_cache = prefix_cache
        self.compact = compact
        self.copy_min = max(1, copy_min)
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

    def plan(self, tokens: list[int], pinned: int = -1, lora: LoraScales = ()) -> PrefixPlan:
        """Picks the free slot for `tokens` (`pinned`, a free one, if >= 0) and the prefix it can
        reuse (needs a free slot), from caches computed under the request's `lora` settings only.

        See the class docstring for the slot choice. If any other slot (busy ones too: their
        evaluated tokens are stable) holds a longer prefix, at least `copy_min` tokens long, it is
        copied in. At most len(tokens) - 1 tokens are reused: the last one must be evaluated to
        get logits.
        """
        free = [s for s in self.slots if not s.busy]
        best = self._prefix_lens(tokens, lora)
        if pinned >= 0:
            dst = self.slots[pinned]
        elif self.compact:
            busy = {s.seq_id for s in self.slots if s.busy}
            dst = min(
                free,
                key=lambda s: (
                    runs_added(busy, s.seq_id),
                    len(s.cached) - best[s.seq_id],
                    s.last_used,
                    s.seq_id,
                ),
            )
        elif self.prefix_cache:
            # A slot that loses no cached token (empty, or all of it reused) first: in one pool a
            # prefix held elsewhere is copied by tagging cells, so a chat template's few shared
            # tokens are no reason to overwrite a long idle cache.
            dst = min(free, key=lambda s: (len(s.cached) > best[s.seq_id], -best[s.seq_id], s.last_used))
        else:
            dst = min(free, key=_lru_key)
        return self._plan_into(dst, best)

    def plan_for(self, dst: Slot, tokens: list[int], lora: LoraScales = ()) -> PrefixPlan:
        """The prefix `tokens` can reuse in `dst`, a slot its request already holds (as `plan`)."""
        return self._plan_into(dst, self._prefix_lens(tokens, lora))

    def _prefix_lens(self, tokens: list[int], lora: LoraScales) -> dict[int, int]:
        """Per seq id, the prefix of `tokens` its KV holds (at most len(tokens) - 1: see `plan`);
        0 where it was computed under other LoRA settings."""
        limit = len(tokens) - 1
        return {
            s.seq_id: common_prefix_len(s.cached, tokens, limit)
            if self.prefix_cache and s.lora == lora
            else 0
            for s in self.slots
        }

    def _plan_into(self, dst: Slot, best: dict[int, int]) -> PrefixPlan:
        """dst's own prefix, or a longer one of at least `copy_min` tokens copied from another slot."""
        if not self.prefix_cache:
            return PrefixPlan(dst, 0)
        own = best[dst.seq_id]
        src = max(self.slots, key=lambda s: (best[s.seq_id], s is not dst))
        if src is not dst and best[src.seq_id] >= max(own + 1, self.copy_min):
            return PrefixPlan(dst, best[src.seq_id], src)
        return PrefixPlan(dst, own)

    def gap_move(self) -> tuple[Slot, Slot] | None:
        """(busy slot, free slot) that closes a gap between runs of busy ids, or None if one run.

        The highest busy slot moves to the lowest free slot below it."""
        busy = sorted(s.seq_id for s in self.slots if s.busy)
        if len(busy) < 2 or busy[-1] - busy[0] + 1 == len(busy):
            return None
        taken = set(busy)
        lowest_gap = next(i for i in range(busy[0], busy[-1]) if i not in taken)
        return self.slots[busy[-1]], self.slots[lowest_gap]

    def move(self, src: Slot, dst: Slot) -> list[MemoryOp]:
        """A running request's KV goes from busy `src` to free `dst`; src stays as an idle cache."""
        n = len(src.cached)
        dst.share_from(src, n)
        self.acquire(dst)
        self.release(src)
        return [SeqRemove(dst.seq_id), SeqCopy(src.seq_id, dst.seq_id, 0, n)]

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


def runs_added(busy: set[int], seq_id: int) -> int:
    """How the count of runs of consecutive busy ids changes if `seq_id` becomes busy: -1 (it
    joins two runs), 0 (it extends one) or +1 (a run of its own)."""
    return 1 - (seq_id - 1 in busy) - (seq_id + 1 in busy)
