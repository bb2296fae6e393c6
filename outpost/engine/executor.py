"""Carries out one `SchedulerOutput` on a loaded model: memory ops, samplers, one llama_decode.

This is the engine side of the scheduler contract (`outpost/scheduler/output.py`); the scheduler
decides, the executor (`ModelRunner`) only translates into llama.cpp calls. It runs on the engine thread only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from outpost.engine.batch import TokenBatch
from outpost.engine.draft_model import DraftModel
from outpost.engine.host_sampling import HostSampler
from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel
from outpost.engine.sampling import SamplerChain, backend_can_sample
from outpost.engine.speculate import verify_draft
from outpost.engine.step_timing import measure_step_times, measure_verify_times
from outpost.messages import TokenLogprob
from outpost.scheduler.budget import StepTimes
from outpost.scheduler.output import (
    BatchChunk,
    MemoryOp,
    RunnerOutput,
    SampledToken,
    SamplerSetup,
    SchedulerOutput,
    SeqCopy,
    SeqRemove,
)


class ModelRunner:
    """Owns the batch buffer and one sampler chain per live request, bound to its sequence."""

    def __init__(
        self, model: LoadedModel, draft_model: DraftModel | None = None, speculating: bool = False
    ) -> None:
        """speculating: requests may carry drafts (the engine's --spec-type or a request's own)."""
        self.model = model
        self.draft_model = draft_model
        self._speculating = speculating or draft_model is not None
        self.batch = TokenBatch(model.n_batch)
        # Chains by request id: a preempted request keeps its own until it is admitted again.
        self.chains: dict[str, SamplerChain] = {}
        self.samplers: dict[int, SamplerChain] = {}  # seq_id -> the chain it samples with
        self._n_probs: dict[int, int] = {}  # seq_id -> top logprobs wanted (absent: none)
        self.host_sampler = HostSampler(model.vocab.n_tokens)
        self.backend_sampling = model.config.effective_backend_sampling
        self._warm = False

    def warmup(self) -> None:
        """One throwaway decode, as llama.cpp's tools do: the first real request should not pay
        for graph allocation and first-touch of the weights. Once: the engine loop calls it again
        after `measure_step_times` has already warmed up."""
        if self._warm:
            return
        self.batch.fill([BatchChunk(0, [max(self.model.vocab.bos, 0)], 0, True)])
        llama.llama_decode(self.model.ctx, self.batch.struct)
        llama.llama_memory_clear(self.model.memory, True)
        self._warm = True

    def measure_step_times(self) -> StepTimes:
        """A decode step's and prompt chunks' times, for `--prefill-budget auto` (warm first: a
        cold step times graph allocation and page faults, not the model)."""
        self.warmup()
        return measure_step_times(self.model, self.batch)

    def measure_verify_times(self) -> tuple[float, float]:
        """A one-token step's and a draft's verification's times at depth (speculation's prices)."""
        self.warmup()
        return measure_verify_times(self.model, self.batch)

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.apply_memory_ops(out.memory_ops)
        for request_id in out.sampler_drops:
            self._drop_chain(request_id)
        for setup in out.sampler_setups:
            self._setup_sampler(setup)
        if not out.chunks:
            return RunnerOutput()
        chunks = out.chunks
        if not self.model.kv_unified:
            # With a stream per slot llama.cpp cuts a micro-batch wherever seq ids stop rising by
            # one (llama_batch_allocr::split_equal, sequential): in seq id order, all busy slots in
            # a row share one pass over the weights.
            chunks = sorted(chunks, key=lambda chunk: chunk.seq_id)
        for chunk in chunks:
            if chunk.n_draft:  # a draft's outputs are verified on the host, one by one
                self.samplers[chunk.seq_id].detach(self.model.ctx)
        self.model.apply_lora(out.lora)  # per context: a step holds one group's settings
        outputs = self.batch.fill(chunks)
        started = time.perf_counter()
        status = int(llama.llama_decode(self.model.ctx, self.batch.struct))
        decode_s = time.perf_counter() - started
        if status != 0:
            return RunnerOutput(decode_status=status, error=_decode_error(status), decode_s=decode_s)
        if not (self._speculating and (out.draft_asks or any(c.n_draft for c in chunks))):
            return RunnerOutput(sampled=self._sample(outputs), decode_s=decode_s)
        result = self._verify_and_draft(out, outputs)
        result.decode_s = decode_s
        return result

    def _verify_and_draft(self, out: SchedulerOutput, outputs: dict[int, int]) -> RunnerOutput:
        """Speculative decoding's step (outpost/engine/speculate.py), drafts for the next one."""
        result = RunnerOutput()
        for chunk in out.chunks:
            if chunk.n_draft:
                result.runs[chunk.seq_id] = verify_draft(self, chunk, outputs.pop(chunk.seq_id))
        result.sampled = self._sample(outputs)
        if out.draft_asks and self.draft_model is not None:
            done = {seq: [t.token for t in run] for seq, run in result.runs.items()}
            done.update({seq: [t.token] for seq, t in result.sampled.items()})
            result.drafts = self.draft_model.draft(out.draft_asks, done)
        return result

    def apply_memory_ops(self, ops: Sequence[MemoryOp]) -> None:
        """In order: a step's ops, or (a slot action between steps) those decided since the last."""
        mem = self.model.memory
        for op in ops:
            if isinstance(op, SeqRemove):
                llama.llama_memory_seq_rm(mem, op.seq_id, op.p0, op.p1)
            elif isinstance(op, SeqCopy):
                self._copy_prefix(op)

    def _copy_prefix(self, op: SeqCopy) -> None:
        """In one KV pool a copy only tags cells; across per-slot streams llama.cpp copies whole
        streams only, so the source's stream is copied and the destination trimmed back to p1."""
        mem = self.model.memory
        if self.model.kv_unified:
            llama.llama_memory_seq_cp(mem, op.src, op.dst, op.p0, op.p1)
            return
        if op.p0 != 0:
            raise ValueError(f"per-slot KV streams copy prefixes only (got p0={op.p0})")
        llama.llama_memory_seq_cp(mem, op.src, op.dst, -1, -1)
        llama.llama_memory_seq_rm(mem, op.dst, op.p1, -1)

    def _setup_sampler(self, setup: SamplerSetup) -> None:
        chain = self.chains.get(setup.request_id)
        before = self.samplers.get(setup.seq_id)
        if before is not None and before is not chain and before.backend_seq == setup.seq_id:
            before.detach(self.model.ctx)  # a preempted request's chain must not sample the newcomer
        if chain is None:  # a new request (a resumed one keeps the chain it had)
            vocab = self.model.vocab
            in_graph = self.backend_sampling and backend_can_sample(setup.params)
            host = None if in_graph else self.host_sampler
            chain = SamplerChain(setup.params, vocab.handle, vocab.n_tokens, vocab.eog_ids, host)
            chain.accept_history(setup.history)
            self.chains[setup.request_id] = chain
            if in_graph:
                chain.attach(self.model.ctx, setup.seq_id)
        elif chain.backend_seq is not None and chain.backend_seq != setup.seq_id:
            chain.attach(self.model.ctx, setup.seq_id)  # a clone of it, its draws continuing
        self.samplers[setup.seq_id] = chain
        if setup.params.n_probs >= 0:
            self._n_probs[setup.seq_id] = setup.params.n_probs
        else:
            self._n_probs.pop(setup.seq_id, None)

    def _drop_chain(self, request_id: str) -> None:
        chain = self.chains.pop(request_id, None)
        if chain is None:
            return
        for seq_id in [s for s, c in self.samplers.items() if c is chain]:
            del self.samplers[seq_id]
            self._n_probs.pop(seq_id, None)
        chain.detach(self.model.ctx)
        chain.free()

    def _sample(self, outputs: dict[int, int]) -> dict[int, SampledToken]:
        """Every sequence the host sampler can do in one call, the rest chain by chain."""
        picks = [(seq, index, h) for seq, index in outputs.items() if (h := self.samplers[seq].host)]
        tokens = self.host_sampler.sample(self.model.ctx, [(h, index) for _, index, h in picks])
        done = {seq: self._sampled(seq, index, t) for (seq, index, _), t in zip(picks, tokens, strict=True)}
        sampled: dict[int, SampledToken] = {}
        for seq_id, index in outputs.items():
            sampled[seq_id] = done[seq_id] if seq_id in done else self.sample_at(seq_id, index)
        return sampled

    def sample_at(self, seq_id: int, index: int) -> SampledToken:
        """Samples (and accepts into its chain) seq_id's token from batch output row `index`."""
        return self._sampled(seq_id, index, self.samplers[seq_id].sample(self.model.ctx, index))

    def _sampled(self, seq_id: int, index: int, token: int) -> SampledToken:
        vocab = self.model.vocab
        n_probs = self._n_probs.get(seq_id)
        logprob = None if n_probs is None else self._logprob(index, token, n_probs)
        return SampledToken(token, vocab.token_to_piece(token), vocab.is_eog(token), logprob)

    def _logprob(self, index: int, token: int, n_top: int) -> TokenLogprob:
        """The model's own distribution at this step (before sampler truncation), as OpenAI reports."""
        logits = self.model.output_logits(index).astype(np.float64)
        shifted = logits - logits.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        top: tuple[tuple[int, float], ...] = ()
        if n_top > 0:
            best = np.argpartition(-logprobs, n_top - 1)[:n_top]
            best = best[np.argsort(-logprobs[best])]
            top = tuple((int(t), float(logprobs[t])) for t in best)
        return TokenLogprob(token, float(logprobs[token]), top)

    def describe_sampling(self) -> str:
        """For the ready line: where tokens are sampled."""
        how = "backend sampling on" if self.backend_sampling else "backend sampling off"
        asked = self.model.config.backend_sampling
        return f"{how} ({'auto' if asked == 'auto' else 'asked'})"

    def close(self) -> None:
        """Free the sampler chains (before the model goes; the caller closes the model)."""
        for chain in self.chains.values():
            chain.detach(self.model.ctx)
            chain.free()
        self.chains.clear()
        self.samplers.clear()
        if self.draft_model is not None:
            self.draft_model.close()
            self.draft_model = None


def _decode_error(status: int) -> str:
    if status == 1:
        return "no free KV cells for this batch"
    if status == 2:
        return "decode aborted"
    if status == -1:
        return "invalid input batch"
    return f"llama_decode failed with code {status}"
