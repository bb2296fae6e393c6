"""Who holds which slot, and the two ways a request gives KV back: leaving a slot and KV pressure.

`Residency` is the scheduler's bookkeeping: the waiting queue, the running requests in admission
order, each slot's owner, and what the next `SchedulerOutput` carries besides chunks (memory ops,
sampler chains to build or drop). Its methods are the primitives the scheduling policy in
`scheduler.py` is built from:

- leaving a slot: a request finishes (its KV stays as prefix cache unless told otherwise) or is
  preempted (its KV goes, and it returns to the head of the queue to be recomputed);
- KV pressure: cells are counted exactly (`slots.py`); when they run short, idle caches go first
  (least recently used), then the youngest running request is preempted.
"""

from __future__ import annotations

from collections import deque

from outpost.messages import FinishReason, RequestRejected, SlotActionError, TokenEvent
from outpost.scheduler.config import SchedulerConfig
from outpost.scheduler.drafters import Drafter, make_drafter
from outpost.scheduler.output import MemoryOp, SamplerSetup, SchedulerOutput, SeqRemove
from outpost.scheduler.pool import SlotPool
from outpost.scheduler.request import RequestState
from outpost.scheduler.slots import Slot
from outpost.scheduler.speculation import SpecState


class Residency:
    """The queue, the running requests and their slots; see the module docstring."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self._pool = SlotPool(
            config.n_slots, config.prefix_cache, compact=not config.shared_kv, copy_min=config.copy_min_tokens
        )
        self._owner: list[RequestState | None] = [None] * config.n_slots  # by seq id
        self._waiting: deque[RequestState] = deque()
        self._running: list[RequestState] = []  # admission order; the last is the youngest
        self._live: dict[str, RequestState] = {}  # waiting or running, by request id
        # What the next SchedulerOutput carries besides chunks; filled by schedule() and update.
        self._ops: list[MemoryOp] = []
        self._setups: dict[int, SamplerSetup] = {}
        self._drops: list[str] = []  # ended requests whose sampler chains the runner may free
        # Cells we plan with: n_ctx, lowered when llama.cpp reports no room (its cache is smaller
        # or fragmented) so the same batch is not retried forever; reset when nothing runs.
        self._kv_limit = config.n_ctx
        self._n_deadlines = 0  # live requests with a deadline: no deadline, no scan
        self._n_awaiting = 0  # running requests awaiting a prefix another computes (sharing.py)
        self._n_spec = 0  # live requests that speculate: none, and the decode step skips it all
        # The n-gram drafters, one of each type, made when a request first asks for it.
        self._drafters: dict[str, Drafter] = {}

    # ---- leaving a slot ----------------------------------------------------------------------

    def _finish(
        self,
        state: RequestState,
        reason: FinishReason,
        now: float,
        token_ids: list[int] | None = None,
        text: str = "",
        *,
        error: str | None = None,
        flush: bool = False,
        clear_kv: bool = False,
    ) -> TokenEvent:
        """Ends a request wherever it is; its KV stays as prefix cache unless `clear_kv`."""
        if flush:
            text += state.text.finish()
        slot = -1 if state.slot is None or clear_kv else state.slot.seq_id
        if state.slot is not None:
            if clear_kv:
                self._ops += self._pool.clear(state.slot)
            self._release(state)
            self._running.remove(state)
        else:
            self._waiting.remove(state)
        del self._live[state.request_id]
        self._drops.append(state.request_id)
        if state.spec is not None:
            self._n_spec -= 1
            drafter = self._drafters.get(state.spec.params.type)
            if drafter is not None:
                drafter.end(state.request_id)
        if state.req.deadline is not None:
            self._n_deadlines -= 1
        event = state.final_event(reason, now, token_ids or [], text, error)
        event.slot = slot
        return event

    def _preempt(self, state: RequestState) -> None:
        """Frees the request's slot and KV; it goes back to the front of the queue to recompute.

        Its sampler chain stays with the runner (no drop): the recompute ends by sampling its next
        token with the chain that has seen every token before it."""
        if state.slot is not None:
            self._ops += self._pool.clear(state.slot)
            self._release(state)
        self._running.remove(state)
        state.prefilled = False
        if state.spec is not None:
            state.spec.draft = []  # it continued a history whose KV is gone
        self._waiting.appendleft(state)

    def _enqueue(self, state: RequestState) -> None:
        """At the back; a resumed request (a cluster stream whose worker went) ahead of every
        request that has not started, so a stream that froze continues at the next free slot."""
        if not state.req.n_resumed:
            self._waiting.append(state)
            return
        fresh = (i for i, s in enumerate(self._waiting) if not s.req.n_resumed and s.admitted_at is None)
        self._waiting.insert(next(fresh, len(self._waiting)), state)

    def _release(self, state: RequestState) -> None:
        slot = state.slot
        if slot is None:
            return
        self._pool.release(slot)
        self._owner[slot.seq_id] = None
        if state.awaiting is not None:  # back in the queue it decides again at its next admission
            state.awaiting = None
            self._n_awaiting -= 1
        self._setups.pop(slot.seq_id, None)  # a chain asked for in this same step is not needed
        state.slot = None

    # ---- KV pressure -------------------------------------------------------------------------

    def _make_room(self, need: int, keep: tuple[Slot | None, ...]) -> bool:
        """Evicts idle caches until `need` more cells fit beside what running prefills still need.

        False if they cannot while others run (the request waits for them); a request alone
        always goes ahead, since one request never needs more than n_ctx_seq <= n_ctx cells.
        """
        reserved = sum(s.n_uncomputed for s in self._running if not s.prefilled)
        while self._free_cells() - reserved < need:
            ops = self._pool.evict_lru(keep)
            if ops is None:
                return not self._running
            self._ops += ops
        return True

    def _free_cells(self) -> int:
        return self._kv_limit - self._pool.cells_used()

    def _fit_decodes(self) -> None:
        """Makes a cell for every generating request: idle caches go first, then the youngest."""
        while self._running:
            if len(self._running) == 1:  # alone it fits n_ctx, whatever we learned with others
                self._kv_limit = self.config.n_ctx
            need = sum(1 for s in self._running if s.prefilled)
            if need <= self._free_cells():
                return
            ops = self._pool.evict_lru()
            if ops is not None:
                self._ops += ops
            elif len(self._running) > 1:
                self._preempt(self._running[-1])
            else:
                return  # cannot happen (one request never exceeds n_ctx); let llama.cpp judge

    def _on_no_kv_slot(self, out: SchedulerOutput, now: float, events: list[TokenEvent]) -> None:
        """llama.cpp found no room for the batch and decoded nothing: make room, retry next step."""
        # The batch fitted our limit but not the real cache: plan with less from now on.
        self._kv_limit = max(1, min(self._kv_limit, self._pool.cells_used() + out.num_tokens - 1))
        for chunk in out.chunks:
            # Nothing was decoded; dropping anything past what we know guards against a partial write.
            self._ops.append(SeqRemove(chunk.seq_id, len(self._pool.slots[chunk.seq_id].cached), -1))
        evicted = False
        while (ops := self._pool.evict_lru()) is not None:
            self._ops += ops
            evicted = True
        if evicted or not self._running:
            return
        if len(self._running) > 1:
            self._preempt(self._running[-1])
            return
        # Alone and still no room: the real cache is smaller than n_ctx says. Retrying would loop.
        error = f"no KV cells for this request even alone: is n_ctx={self.config.n_ctx} right?"
        state = self._running[0]
        events.append(self._finish(state, FinishReason.ERROR, now, error=error, flush=True, clear_kv=True))

    # ---- llama-server's slot actions (/slots/{id}?action=save|restore|erase) -------------------
    # The engine thread calls these between steps, under the core's lock; it applies
    # `take_memory_ops()` before touching a sequence itself, so llama.cpp's KV matches `cached`.

    def idle_slot(self, seq_id: int) -> Slot:
        """The slot a slot action names, if it exists and no request holds it."""
        if not 0 <= seq_id < len(self._pool.slots):
            raise SlotActionError(
                f"Invalid slot ID {seq_id}: this server has slots 0..{len(self._pool.slots) - 1}",
                "unknown_slot",
            )
        slot = self._pool.slots[seq_id]
        if slot.busy:
            raise SlotActionError(f"slot {seq_id} is processing a request: retry when it is idle", "busy")
        return slot

    def take_memory_ops(self) -> list[MemoryOp]:
        """The memory ops decided since the last step, for the caller to apply now."""
        ops, self._ops = self._ops, []
        return ops

    def erase_slot(self, seq_id: int) -> int:
        """Drops an idle slot's KV; returns the tokens it held."""
        slot = self.idle_slot(seq_id)
        n = len(slot.cached)
        self._ops += self._pool.clear(slot)
        return n

    def clear_for_restore(self, seq_id: int, n_tokens: int) -> None:
        """Empties an idle slot and evicts other idle caches (LRU) until `n_tokens` cells are free."""
        slot = self.idle_slot(seq_id)
        self._ops += self._pool.clear(slot)
        while self._free_cells() < n_tokens:
            ops = self._pool.evict_lru((slot,))
            if ops is None:
                break
            self._ops += ops

    def restored(self, seq_id: int, tokens: list[int]) -> None:
        """The slot's sequence now holds `tokens` at positions 0.. (read back from a file)."""
        slot = self._pool.slots[seq_id]
        slot.clear()
        if tokens:
            slot.append(list(tokens), self._pool.new_origin())
        self._pool.touch(slot)

    # ---- speculative decoding ------------------------------------------------------------------

    def _start_spec(self, state: RequestState) -> None:
        """Gives a new request its speculation, if it (or the engine's default) asks for one."""
        params = self.config.speculative
        if state.req.speculative is not None:
            try:
                params = state.req.speculative.over(params)
            except ValueError as exc:
                raise RequestRejected(str(exc)) from None
        if not params.enabled:
            return
        if params.type == "draft" and not self.config.draft_model:
            raise RequestRejected("speculative type 'draft' needs a server started with a draft model (-md)")
        state.spec = SpecState(params)
        self._n_spec += 1
        if params.type not in self._drafters:
            drafter = make_drafter(params.type, self.config.ngram_simple)
            if drafter is None:
                return
            self._drafters[params.type] = drafter
        self._drafters[params.type].begin(state.request_id, state.tokens)
