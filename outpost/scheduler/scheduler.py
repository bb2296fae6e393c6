"""The continuous-batching scheduler, after vLLM v1's `schedule()` / `update_from_output()`.

Pure logic: no I/O, no clock, no llama.cpp. Each engine step the loop calls `schedule(now)`, hands
the `SchedulerOutput` to a runner, and passes the `RunnerOutput` to `update_from_output()`, which
returns the step's `TokenEvent`s. Decisions taken inside `schedule()` (aborts, deadlines) come back
as events from the `update_from_output()` that follows it.

A step, in order: apply aborts and deadlines; copy in prefixes that requests awaited from another
request's prefill (`sharing.py`); admit waiting requests FCFS (a cluster request resumed after its
worker went is queued ahead of those not started) into free slots, reusing the longest
cached prefix (computed under the same LoRA settings) or awaiting one being computed; then build one
batch for one group of LoRA settings (`lora_turns.py`): one token for every generating request, then
prompt chunks in admission order up to the token budget (chunked prefill). KV cells
are counted exactly (see `slots.py`); when they run short, idle caches go first (LRU), then the
youngest running request is preempted and later recomputed (`residency.py`: the bookkeeping,
leaving a slot, KV pressure).
"""

from __future__ import annotations

from collections.abc import Callable

from outpost.messages import FinishReason, GenerateRequest, LoraScales, QueueFull, RequestRejected, TokenEvent
from outpost.scheduler.config import SchedulerConfig
from outpost.scheduler.lora_turns import LoraTurns
from outpost.scheduler.output import (
    BatchChunk,
    DraftAsk,
    RunnerOutput,
    SampledToken,
    SamplerSetup,
    SchedulerOutput,
    SeqRemove,
)
from outpost.scheduler.pool import PrefixPlan
from outpost.scheduler.prefill import prefill_budget, prefill_chunks
from outpost.scheduler.request import RequestState, add_progress, check_admissible
from outpost.scheduler.residency import Residency
from outpost.scheduler.sharing import next_move, source_to_await
from outpost.scheduler.spec_batch import add_drafts, draft_asks, keep_draft

# With a KV stream per slot, a gap between busy slots that lasts this many steps with nothing
# waiting is closed by moving the highest request down (one copy of its stream), if it may still
# generate this many tokens: each step above the gap costs a pass over the weights.
COMPACT_AFTER_STEPS = 4
COMPACT_MIN_TOKENS_LEFT = 16


class Scheduler(Residency):
    """Owns the waiting queue, the slots and every live request. Not thread-safe: one caller."""

    def __init__(self, config: SchedulerConfig, token_piece: Callable[[int], bytes] | None = None) -> None:
        """token_piece: a token's bytes as the runner renders them (primes resumed requests' text)."""
        super().__init__(config)
        self._token_piece = token_piece
        self._aborts: set[str] = set()
        self._events: list[TokenEvent] = []  # decided in schedule(), returned by the next update
        self._gap_steps = 0  # steps a gap between busy slots has lasted (KV stream per slot)
        self.slot_moves = 0  # requests moved down into a gap (stats)
        self._turns = LoraTurns()
        self._lora: LoraScales = ()  # the settings of the batch _build_batch made last

    # ---- the engine loop's API -------------------------------------------------------------

    def add_request(self, req: GenerateRequest) -> None:
        """Queues a request; raises RequestRejected (never servable) or QueueFull (try later)."""
        check_admissible(req, self.config.n_ctx_seq)
        if not -1 <= req.slot < self.config.n_slots:
            raise RequestRejected(f"id_slot {req.slot} is not a slot (0 to {self.config.n_slots - 1}, or -1)")
        if req.request_id in self._live:
            raise RequestRejected(f"request id {req.request_id!r} is already in use")
        # The bound counts requests that will not find a free slot at the next step.
        free_slots = self.config.n_slots - self._pool.n_busy
        if len(self._waiting) >= self.config.max_queue + free_slots:
            raise QueueFull(
                f"{len(self._waiting)} requests are waiting (max_queue={self.config.max_queue}): retry later"
            )
        state = RequestState.new(req, self._token_piece)
        self._start_spec(state)
        self._enqueue(state)
        self._live[req.request_id] = state
        if req.deadline is not None:
            self._n_deadlines += 1

    def abort(self, request_id: str) -> None:
        """Ends a request at the next schedule() with one ABORT event; unknown ids are ignored."""
        if request_id in self._live:
            self._aborts.add(request_id)

    def schedule(self, now: float) -> SchedulerOutput:
        """Decides one step: memory ops, sampler chains to build or drop, and the batch."""
        # The guards keep a steady decode step short: it runs once per token, right after a
        # decode that left the CPU caches cold, so every skipped line shows in tokens/s.
        if self._aborts:
            self._apply_aborts(now)
        if self._n_deadlines:
            self._expire(now)
        if self._n_awaiting:
            # Before admission: a newcomer must not take (and clear) a finished source's cache first.
            self._settle_waits()
        if self._waiting:
            self._admit(now)
        if self._pool.compact and self._running:
            self._compact()
        chunks, asks = self._build_batch()
        for chunk in chunks:
            owner = self._owner[chunk.seq_id]
            if owner is not None and owner.scheduled_at is None:
                owner.scheduled_at = now
        out = SchedulerOutput(
            memory_ops=self._ops,
            sampler_setups=list(self._setups.values()),
            sampler_drops=self._drops,
            chunks=chunks,
            draft_asks=asks,
            lora=self._lora,
        )
        self._ops, self._setups, self._drops = [], {}, []
        return out

    def update_from_output(self, out: SchedulerOutput, result: RunnerOutput, now: float) -> list[TokenEvent]:
        """Applies what the runner did with `out` (the last schedule()'s) and returns the events."""
        events, self._events = self._events, []
        if not (out.chunks or out.sampler_setups):
            return events
        if result.decode_status == 0 and result.error is None:
            self._on_success(out, result, now, events)
        elif result.decode_status == 1 and out.chunks:
            self._on_no_kv_slot(out, now, events)
        else:
            self._on_failure(out, result, now, events)
        return events

    def has_work(self) -> bool:
        """Anything waiting, running, or events and memory/sampler ops still to hand out."""
        return bool(self._waiting or self._running or self._events or self._ops or self._drops)

    # ---- read-only stats ---------------------------------------------------------------------

    @property
    def slots_busy(self) -> int:
        return self._pool.n_busy

    @property
    def queue_depth(self) -> int:
        return len(self._waiting)

    @property
    def prompts_pending(self) -> bool:
        """A request waits for a slot, or holds one with its prompt not all read yet."""
        return bool(self._waiting) or any(not state.prefilled for state in self._running)

    @property
    def kv_cells_used(self) -> int:
        """KV cells held by all sequences (shared prefix cells once), as the scheduler tracks them."""
        return self._pool.cells_used()

    def cached_sequences(self) -> list[tuple[int, ...]]:
        """What every slot's KV holds (busy and idle), for prefix-aware routing."""
        return [tuple(s.cached) for s in self._pool.slots if s.cached]

    def cached_tokens(self, seq_id: int) -> tuple[int, ...]:
        """The tokens the scheduler believes sequence `seq_id` holds (for tests and debugging)."""
        return tuple(self._pool.slots[seq_id].cached)

    # ---- schedule(): leaving, admission, batch -------------------------------------------------

    def _apply_aborts(self, now: float) -> None:
        for request_id in self._aborts:
            state = self._live.get(request_id)
            if state is not None:  # it may have finished since abort() was called
                self._events.append(self._finish(state, FinishReason.ABORT, now, flush=True))
        self._aborts.clear()

    def _expire(self, now: float) -> None:
        expired = [
            s
            for queue in (self._waiting, self._running)
            for s in queue
            if s.req.deadline is not None and s.req.deadline < now
        ]
        for state in expired:
            self._events.append(self._finish(state, FinishReason.TIMEOUT, now, flush=True))

    def _admit(self, now: float) -> None:
        """FCFS: the head of the queue takes a free slot, or nobody does (no overtaking). A request
        whose slot (`id_slot`) is busy is passed over until it frees, as llama-server defers it."""
        if not self._running:
            self._kv_limit = self.config.n_ctx
        while self._waiting and self._pool.has_free():
            state = next((s for s in self._waiting if self._slot_ready(s)), None)
            if state is None:
                return
            plan = self._pool.plan(state.tokens, state.req.slot, state.lora)
            wait = source_to_await(self._pool, plan, state.tokens, self._running, state.lora)
            if wait is not None:  # its prefix arrives by copy once computed; dst holds nothing till then
                plan = PrefixPlan(plan.dst, 0)
            # Applied first: dropping dst's stale tail frees cells the room check can then count.
            # If the request must wait for room, dst keeps the prefix it will most likely get again.
            self._ops += self._pool.apply(plan)
            plan.dst.lora = state.lora  # what it holds and will compute is under the request's settings
            reuse = plan.reuse if wait is None else wait[1]  # the source reserves the awaited cells
            if not self._make_room(len(state.tokens) - reuse, (plan.dst, plan.src)):
                return
            self._waiting.remove(state)
            self._pool.acquire(plan.dst)
            self._owner[plan.dst.seq_id] = state
            self._running.append(state)
            state.slot, state.prefilled = plan.dst, False
            state.timings.cache_n = plan.reuse  # after a preemption: what the recompute reused
            if wait is not None:
                state.awaiting = wait
                self._n_awaiting += 1
            if state.admitted_at is None:
                state.admitted_at = now
            seq = plan.dst.seq_id
            # After a preemption the runner still has the request's chain and ignores the history.
            self._setups[seq] = SamplerSetup(
                seq, state.request_id, state.req.sampling, state.penalty_history()
            )
            if self.config.shared_kv:
                self._ops += self._pool.trim_idle(self.config.idle_cache_cells, (plan.dst, plan.src))

    def _slot_ready(self, state: RequestState) -> bool:
        return state.req.slot < 0 or not self._pool.slots[state.req.slot].busy

    def _settle_waits(self) -> None:
        """Awaited prefixes now in the source's KV are copied in; a waiter whose source left decides
        again (sharing.py). In admission order: a waiter that now computes may source the next."""
        for state in self._running:
            if state.awaiting is None or state.slot is None:
                continue
            move = next_move(self._pool, state.tokens, state.awaiting, state.slot, self._running, state.lora)
            if not isinstance(move, PrefixPlan):
                state.awaiting = move
                continue
            self._ops += self._pool.apply(move)
            state.timings.cache_n = move.reuse
            state.awaiting = None
            self._n_awaiting -= 1

    def _compact(self) -> None:
        """Closes a gap between runs of busy slots that has outlived a few steps.

        With a KV stream per slot llama.cpp decodes each run of consecutive busy seq ids in its
        own pass over the weights, so a gap costs every step a pass; a move costs one copy of the
        stream. New arrivals fill gaps for free (admission prefers them), so only a gap that lasts
        with nothing waiting is closed, and only for a request that may still run a while.
        """
        move = None if self._waiting else self._pool.gap_move()
        if move is None:
            self._gap_steps = 0
            return
        self._gap_steps += 1
        src, dst = move
        state = self._owner[src.seq_id]
        if state is None or self._gap_steps < COMPACT_AFTER_STEPS or state.req.slot >= 0:
            return
        if state.req.max_tokens - state.n_generated < COMPACT_MIN_TOKENS_LEFT:
            return
        self._ops += self._pool.move(src, dst)
        self.slot_moves += 1
        self._owner[src.seq_id] = None
        self._owner[dst.seq_id] = state
        state.slot = dst
        self._gap_steps = 0
        # The request keeps its sampler chain; the runner only learns its new seq id.
        self._setups.pop(src.seq_id, None)
        self._setups[dst.seq_id] = SamplerSetup(
            dst.seq_id, state.request_id, state.req.sampling, state.penalty_history()
        )

    def _build_batch(self) -> tuple[list[BatchChunk], list[DraftAsk]]:
        """One group of LoRA settings' batch, the groups in turn (lora_turns.py); preempts the
        youngest if no group's fits."""
        while True:
            self._fit_decodes()
            if self._n_awaiting:  # a source preempted just now: its waiters decide again
                self._settle_waits()
            for lora in self._turns.order(self._running):
                chunks, asks = self._group_batch(lora)
                if chunks:
                    self._turns.served(lora)
                    self._lora = lora
                if chunks or not self._running:
                    return chunks, asks
            self._preempt(self._running[-1])

    def _group_batch(self, lora: LoraScales) -> tuple[list[BatchChunk], list[DraftAsk]]:
        """Decode tokens (with drafts) first, then prompt chunks, of the requests under `lora`."""
        decoding: list[RequestState] = []
        chunks: list[BatchChunk] = []
        for s in self._running:
            if s.prefilled and s.slot is not None and s.lora == lora:
                decoding.append(s)
                chunks.append(BatchChunk(s.slot.seq_id, [s.tokens[-1]], len(s.tokens) - 1, True))
        n_tokens = len(chunks)
        if self._n_spec and decoding:
            n_tokens += add_drafts(self, decoding, chunks)
        room = self.config.step_token_budget - n_tokens
        chunks += prefill_chunks(
            self, min(prefill_budget(self.config, len(chunks)), room), n_tokens, room, lora
        )
        asks = draft_asks(self, chunks, len(decoding)) if self._n_spec and chunks else []
        return chunks, asks

    # ---- update_from_output() ------------------------------------------------------------------

    def _on_success(
        self, out: SchedulerOutput, result: RunnerOutput, now: float, events: list[TokenEvent]
    ) -> None:
        for chunk in out.chunks:
            state = self._owner[chunk.seq_id]
            if state is None or state.slot is None:
                continue
            reading = not state.prefilled
            n_events = len(events)
            self._on_chunk(state, chunk, result, now, events)
            if reading and state.req.progress:
                add_progress(state, now, events, n_events)

    def _on_chunk(
        self, state: RequestState, chunk: BatchChunk, out: RunnerOutput, now: float, events: list[TokenEvent]
    ) -> None:
        """One decoded chunk: its tokens in the slot, and the sampled token's event if it sampled."""
        assert state.slot is not None
        if not chunk.n_draft:  # a draft's tokens go in as far as they were accepted
            state.slot.append(chunk.tokens, self._pool.new_origin())
        if not state.prefilled:
            state.timings.prompt_n += len(chunk.tokens)
        if not chunk.sample:
            return
        state.prefilled = True
        if chunk.n_draft:
            run = out.runs.get(chunk.seq_id)
            if run:
                events.append(self._on_verified(state, chunk, run, now))
                keep_draft(state, chunk.seq_id, out)
                return
            token = None
            self._ops.append(SeqRemove(chunk.seq_id, chunk.start_pos, -1))  # KV as we know it
        else:
            token = out.sampled.get(chunk.seq_id)
        keep_draft(state, chunk.seq_id, out)
        if token is None:
            error = f"the runner sampled no token for sequence {chunk.seq_id}"
            events.append(self._finish(state, FinishReason.ERROR, now, error=error, flush=True))
        else:
            events.append(self._on_tokens(state, [token], now))

    def _on_verified(
        self, state: RequestState, chunk: BatchChunk, run: list[SampledToken], now: float
    ) -> TokenEvent:
        """A verified draft: rejected positions leave the KV (from the first one on)."""
        spec = state.spec
        assert spec is not None and state.slot is not None
        n_accepted = min(len(run) - 1, chunk.n_draft)
        kept = 1 + n_accepted
        state.slot.append(chunk.tokens[:kept], self._pool.new_origin())
        if n_accepted < chunk.n_draft:
            self._ops.append(SeqRemove(chunk.seq_id, chunk.start_pos + kept, -1))
        spec.record(chunk.n_draft, n_accepted)
        state.timings.draft_n += chunk.n_draft
        state.timings.draft_n_accepted += n_accepted
        state.timings.draft_steps += 1
        drafter = self._drafters.get(spec.params.type)
        if drafter is not None:
            drafter.accept(state.request_id, chunk.n_draft, n_accepted)
        return self._on_tokens(state, run[:kept], now)

    def _on_tokens(self, state: RequestState, run: list[SampledToken], now: float) -> TokenEvent:
        """Records sampled tokens in order; finishes on EOG, a stop string, max_tokens or context end
        (tokens after that are dropped: their KV stays, as any cache, but they are not output)."""
        ids: list[int] = []
        text = ""
        logprobs = [t.logprob for t in run if t.logprob is not None]
        event: TokenEvent | None = None
        for token in run:
            state.tokens.append(token.token)
            state.on_token(now)
            if token.is_eog and not state.req.sampling.ignore_eos:
                # The EOG token renders as nothing and is not part of the answer: not in token_ids.
                event = self._finish(state, FinishReason.STOP, now, ids, text, flush=True)
                break
            piece, stopped = state.text.feed(token.piece)
            text += piece
            ids.append(token.token)
            if stopped:
                event = self._finish(state, FinishReason.STOP, now, ids, text)
                break
            if state.n_generated >= state.budget or len(state.tokens) >= self.config.n_ctx_seq:
                event = self._finish(state, FinishReason.LENGTH, now, ids, text, flush=True)
                break
        if event is None:
            event = TokenEvent(state.request_id, ids, text)
        if logprobs:
            event.logprobs = logprobs[: len(ids)] if event.finished else logprobs
        return event

    def _on_failure(
        self, out: SchedulerOutput, result: RunnerOutput, now: float, events: list[TokenEvent]
    ) -> None:
        """A fatal step: fail the requests that had a chunk in it, keep serving the others."""
        error = result.error or f"llama_decode failed with status {result.decode_status}"
        for chunk in out.chunks:
            state = self._owner[chunk.seq_id]
            if state is not None:
                events.append(
                    self._finish(state, FinishReason.ERROR, now, error=error, flush=True, clear_kv=True)
                )
        for setup in out.sampler_setups:
            # The runner may have failed before building this chain: ask for it again.
            if self._owner[setup.seq_id] is not None:
                self._setups[setup.seq_id] = setup
