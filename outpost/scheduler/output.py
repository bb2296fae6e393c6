"""The contract between the scheduler and a model runner.

Each engine step: `Scheduler.schedule()` returns a `SchedulerOutput` (what to do to the KV memory,
which samplers to (re)build, which token chunks to decode); a runner (the real one in
`outpost/engine/executor.py`, or a fake in tests) carries it out and returns a `RunnerOutput`;
`Scheduler.update_from_output()` turns that into `TokenEvent`s. Sequence ids are slot numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outpost.messages import LoraScales, SamplingParams, TokenLogprob


@dataclass(frozen=True)
class SeqRemove:
    """`llama_memory_seq_rm(seq_id, p0, p1)`: drop cells at positions [p0, p1); -1 is open-ended."""

    seq_id: int
    p0: int = -1
    p1: int = -1


@dataclass(frozen=True)
class SeqCopy:
    """`llama_memory_seq_cp(src, dst, p0, p1)`: dst shares src's cells at positions [p0, p1)."""

    src: int
    dst: int
    p0: int = 0
    p1: int = -1


MemoryOp = SeqRemove | SeqCopy


@dataclass(frozen=True)
class SamplerSetup:
    """Sample `seq_id` with request `request_id`'s sampler chain from now on.

    A chain belongs to its request, not to a slot: the runner builds it the first time it sees the
    request (`history`, the prompt's tail, primes the penalty window) and keeps it until the
    request ends (`SchedulerOutput.sampler_drops`). A request preempted under KV pressure and
    admitted again, maybe to another slot, resumes with the same chain: its grammar stays where
    the document is, its penalty window and its seeded RNG continue exactly.
    """

    seq_id: int
    request_id: str
    params: SamplingParams
    history: tuple[int, ...] = ()


@dataclass(frozen=True)
class BatchChunk:
    """Tokens of one sequence at positions start_pos, start_pos+1, ... to decode in this step.

    `sample`: the last token's logits are wanted and the runner samples one token from them with
    the sequence's chain (a decode token, or the final chunk of a prompt).

    `n_draft` > 0 (speculative decoding): the last n_draft tokens are a draft to verify. The runner
    samples at each of the last n_draft + 1 positions in order with the chain, and stops after
    the first sampled token that differs from the draft token after it (or after the last
    position): `RunnerOutput.runs` gets the accepted draft tokens and that one.
    """

    seq_id: int
    tokens: list[int]
    start_pos: int
    sample: bool
    n_draft: int = 0


@dataclass(frozen=True)
class DraftAsk:
    """Draft up to `n_max` tokens for `seq_id` once this step's tokens are sampled (the draft
    model, which the runner drives): `history` is the request's tokens before this step's output
    (the runner appends what it samples), and the draft continues after the last of them."""

    seq_id: int
    request_id: str
    history: list[int]
    n_max: int


@dataclass
class SchedulerOutput:
    """One step's work, in the order the runner must do it: memory ops, sampler drops, sampler
    setups, then one decode."""

    memory_ops: list[MemoryOp] = field(default_factory=list)
    sampler_setups: list[SamplerSetup] = field(default_factory=list)
    # Requests that ended: their chains may be freed (before this step's setups: an id may be reused).
    sampler_drops: list[str] = field(default_factory=list)
    chunks: list[BatchChunk] = field(default_factory=list)
    draft_asks: list[DraftAsk] = field(default_factory=list)
    # The LoRA settings every chunk decodes under: a step never mixes them (lora_turns.py).
    lora: LoraScales = ()

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not (self.memory_ops or self.sampler_setups or self.sampler_drops or self.chunks)


@dataclass(frozen=True)
class SampledToken:
    """One sampled token with the bytes it renders as (special tokens render as b"")."""

    token: int
    piece: bytes
    is_eog: bool
    logprob: TokenLogprob | None = None  # filled when the request's SamplingParams.n_probs >= 0


@dataclass
class RunnerOutput:
    """What the runner did with a `SchedulerOutput`.

    decode_status: llama_decode's return code (0 ok; 1 no KV slot: nothing was decoded, the
    scheduler makes room and retries; anything else failed every chunk of the step).
    """

    sampled: dict[int, SampledToken] = field(default_factory=dict)  # seq_id -> token
    decode_status: int = 0
    error: str | None = None
    # Chunks with a draft: seq_id -> the accepted draft tokens, then the token sampled after them.
    runs: dict[int, list[SampledToken]] = field(default_factory=dict)
    drafts: dict[int, list[int]] = field(default_factory=dict)  # answers to DraftAsks, by seq_id
    decode_s: float = 0.0  # seconds in llama_decode (the engine's step profile reports it)
