"""The draft model (`-md`): a second, smaller model with the target's vocabulary that drafts the
tokens speculative decoding verifies (`DraftAsk` in, drafts out; see outpost/scheduler/speculation.py).

It has its own context and KV, shaped as the target's (same sequence ids, one per slot), on the
engine thread, and is driven by the target's runner after each step's sampling. Each sequence's
draft KV is kept as a copy of the request's history: a step only evaluates what is new since the
last draft (the token sampled after the accepted draft tokens; the whole prompt the first time),
found by the longest common prefix with what the KV holds, then drafts greedily one token per
decode for every asking sequence together.
"""

from __future__ import annotations

from outpost.engine.batch import TokenBatch
from outpost.engine.lib import llama
from outpost.engine.logits import logits_row
from outpost.engine.model import LoadedModel, ModelLoadError
from outpost.engine.step_timing import measure_step_times, measure_verify_times
from outpost.scheduler.budget import StepTimes
from outpost.scheduler.output import BatchChunk, DraftAsk
from outpost.scheduler.slots import common_prefix_len


class DraftModel:
    """Owns the draft model's context; `draft()` answers one step's asks."""

    def __init__(self, model: LoadedModel, target_n_vocab: int) -> None:
        if model.vocab.n_tokens != target_n_vocab:
            model.close()
            raise ModelLoadError(
                f"the draft model has {model.vocab.n_tokens} tokens, the target {target_n_vocab}: "
                "a draft model must share the target's vocabulary"
            )
        self.model = model
        self.batch = TokenBatch(model.n_batch)
        self.cached: dict[int, list[int]] = {}  # seq id -> the tokens its draft KV holds

    def draft(self, asks: list[DraftAsk], outputs: dict[int, list[int]]) -> dict[int, list[int]]:
        """Drafts for each ask: its history plus this step's `outputs` for its seq id, continued."""
        histories = {a.seq_id: a.history + outputs.get(a.seq_id, []) for a in asks}
        wanted = {a.seq_id: a.n_max for a in asks}
        pending = self._catch_up(histories)
        if pending is None:
            return {}
        drafts: dict[int, list[int]] = {seq: [] for seq in histories}
        n_vocab = self.model.vocab.n_tokens
        ctx = self.model.ctx
        while pending:
            chunks = []
            for seq, index in pending.items():
                token = int(logits_row(ctx, index, n_vocab).argmax())
                drafts[seq].append(token)
                if len(drafts[seq]) < wanted[seq]:
                    chunks.append(BatchChunk(seq, [token], len(self.cached[seq]), True))
            if not chunks:
                break
            pending = self._decode(chunks)
            if pending is None:
                return {}
        return drafts

    def _catch_up(self, histories: dict[int, list[int]]) -> dict[int, int] | None:
        """Evaluates what each sequence's KV lacks of its history; seq id -> its last row.

        Everything but each history's last token first, in as many decodes as n_batch needs, and
        every last token in the final one: a decode's logits replace the one before's, so the rows
        returned must all come from the final decode."""
        mem = self.model.memory
        bulk: list[BatchChunk] = []
        last: list[BatchChunk] = []
        for seq, history in histories.items():
            held = self.cached.get(seq, [])
            # The last token is evaluated again if held already: its logits are the ones we need.
            keep = common_prefix_len(held, history, len(history) - 1)
            llama.llama_memory_seq_rm(mem, seq, keep, -1)
            self.cached[seq] = held[:keep]
            if len(history) - 1 > keep:
                bulk.append(BatchChunk(seq, history[keep:-1], keep, False))
            last.append(BatchChunk(seq, history[-1:], len(history) - 1, True))
        steps = _batches(bulk, self.model.n_batch)
        # The last tokens ride in the bulk's final decode where they fit: after a verified draft
        # a history is typically two tokens ahead (the last draft token and the one sampled after
        # it), and a decode apart for one of them was a draft step in three.
        if steps and sum(len(c.tokens) for c in steps[-1]) + len(last) <= self.model.n_batch:
            last = steps.pop() + last
        for step in steps:
            if self._decode(step) is None:
                return None
        return self._decode(last)

    def _decode(self, chunks: list[BatchChunk]) -> dict[int, int] | None:
        """One llama_decode; seq id -> the batch row of its logits. None (and the draft KV
        cleared) when it fails: drafting is an optimisation, never an error."""
        if not self.model.kv_unified:
            chunks = sorted(chunks, key=lambda c: c.seq_id)
        rows = self.batch.fill(chunks)
        if int(llama.llama_decode(self.model.ctx, self.batch.struct)) != 0:
            llama.llama_memory_clear(self.model.memory, True)
            self.cached.clear()
            return None
        for c in chunks:
            self.cached.setdefault(c.seq_id, []).extend(c.tokens)
        return rows

    def measure_step_times(self) -> StepTimes:
        """A draft step's and prompt chunks' times (as the target's are measured at start)."""
        times = measure_step_times(self.model, self.batch)
        self.cached.clear()
        return times

    def measure_step_at_depth(self) -> float:
        """A draft step's time after the history the target's verification is timed at."""
        step, _ = measure_verify_times(self.model, self.batch, n_draft=0)
        self.cached.clear()
        return step

    def close(self) -> None:
        self.model.close()


def _batches(chunks: list[BatchChunk], room: int) -> list[list[BatchChunk]]:
    """`chunks` cut into decodes of at most `room` tokens, each sequence's pieces in order."""
    steps: list[list[BatchChunk]] = []
    step: list[BatchChunk] = []
    used = 0
    for c in chunks:
        tokens, pos = c.tokens, c.start_pos
        while tokens:
            n = min(len(tokens), room - used)
            step.append(BatchChunk(c.seq_id, tokens[:n], pos, False))
            tokens, pos, used = tokens[n:], pos + n, used + n
            if used == room:
                steps.append(step)
                step, used = [], 0
    if step:
        steps.append(step)
    return steps
