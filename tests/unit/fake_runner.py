"""A model-free runner for scheduler tests: a simulated unified KV cache and scripted sampling.

The KV store behaves like llama.cpp's unified cache: cells hold (position, token, set of seq ids);
`seq_rm` takes a seq id off cells (freeing cells nobody holds), `seq_cp` adds one (sharing, no new
cells). Decoding checks that every chunk starts exactly at its sequence's current length, counts
evaluated tokens, and returns status 1 (changing nothing) when the cells would exceed `capacity`.

Sampling is deterministic: the next token is a function of the sequence's whole history (the
tokens in its KV), so recomputation after a preemption or a prefix copy gives the same text.
`script(prompt, outputs)` pins the continuation of one prompt. Chains belong to requests, as in
the real runner; with `stateful_chains` a chain's own count of sampled tokens also steers the
next token (like a seeded RNG or a grammar), so a chain rebuilt mid-request shows in the text.

Speculative decoding: a chunk with a draft is verified as the real runner does (sample at each
position in order, stop after the first token that differs from the draft); `dist` makes
sampling random (history -> probabilities over a small vocabulary, drawn with the chain's own
RNG seeded from the request's seed, one draw per sampled token); `draft_model` answers the
scheduler's DraftAsks (history, n_max -> draft).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from outpost.scheduler.output import (
    RunnerOutput,
    SampledToken,
    SamplerSetup,
    SchedulerOutput,
    SeqCopy,
    SeqRemove,
)

EOG = 0
SPACE = 27
# A tiny vocabulary: letters, and characters whose UTF-8 bytes are split over two tokens.
VOCAB: dict[int, bytes] = {EOG: b"", SPACE: b" "}
VOCAB.update({i: bytes([ord("a") + i - 1]) for i in range(1, 27)})
VOCAB.update(
    {
        30: b"\xc3",  # é = c3 a9
        31: b"\xa9",
        32: b"\xe2",  # € = e2 82 ac
        33: b"\x82\xac",
        34: b"\xf0\x9f",  # 😀 = f0 9f 98 80
        35: b"\x98\x80",
        36: b"\xff",  # never valid UTF-8
        40: b"S",
        41: b"T",
        42: b"O",
        43: b"P",
        44: b"ST",
        45: b"OP",
        46: b"!",
    }
)


def piece(token: int) -> bytes:
    return VOCAB.get(token, b"<%d>" % token)


def default_next(history: Sequence[int]) -> int:
    """The unscripted continuation: a letter that depends on the last token and the length."""
    return 1 + (history[-1] * 31 + len(history) * 7) % 26


def reference_tokens(prompt: Sequence[int], n: int) -> list[int]:
    """What `default_next` generates for `prompt`, without any scheduler."""
    history = list(prompt)
    for _ in range(n):
        history.append(default_next(history))
    return history[len(prompt) :]


def text_of(tokens: Sequence[int]) -> str:
    return b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")


@dataclass
class Cell:
    pos: int
    token: int
    seqs: set[int]


@dataclass
class FakeKV:
    """llama.cpp's unified KV cache, semantically."""

    cells: dict[int, Cell] = field(default_factory=dict)
    by_seq: dict[int, dict[int, int]] = field(default_factory=dict)  # seq -> pos -> cell id
    next_id: int = 0

    def seq_rm(self, seq: int, p0: int, p1: int) -> None:
        lo, hi = max(p0, 0), p1 if p1 >= 0 else 1 << 60
        held = self.by_seq.setdefault(seq, {})
        for pos in [p for p in held if lo <= p < hi]:
            cid = held.pop(pos)
            self.cells[cid].seqs.discard(seq)
            if not self.cells[cid].seqs:
                del self.cells[cid]

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        lo, hi = max(p0, 0), p1 if p1 >= 0 else 1 << 60
        dst_held = self.by_seq.setdefault(dst, {})
        for pos, cid in self.by_seq.get(src, {}).items():
            if lo <= pos < hi:
                assert pos not in dst_held, f"seq {dst} already has a cell at {pos}"
                dst_held[pos] = cid
                self.cells[cid].seqs.add(dst)

    def tokens(self, seq: int) -> list[int]:
        held = self.by_seq.get(seq, {})
        assert sorted(held) == list(range(len(held))), f"seq {seq} has holes: {sorted(held)}"
        return [self.cells[held[p]].token for p in range(len(held))]

    def add(self, seq: int, pos: int, token: int) -> None:
        self.next_id += 1
        self.cells[self.next_id] = Cell(pos, token, {seq})
        self.by_seq.setdefault(seq, {})[pos] = self.next_id

    @property
    def used(self) -> int:
        return len(self.cells)


@dataclass
class FakeChain:
    """A request's sampler chain: how it was set up and every token it has sampled."""

    setup: SamplerSetup
    sampled: list[int] = field(default_factory=list)
    rng: random.Random = field(default_factory=random.Random)


class FakeRunner:
    """Carries out SchedulerOutputs on FakeKV; see the module docstring."""

    def __init__(
        self, capacity: int | None = None, n_batch: int | None = None, stateful_chains: bool = False
    ) -> None:
        self.kv = FakeKV()
        self.capacity = capacity
        self.n_batch = n_batch
        self.stateful_chains = stateful_chains
        self.chains: dict[str, FakeChain] = {}  # by request id, until the request ends
        self.chains_built = 0
        self.samplers: dict[int, FakeChain] = {}  # seq id -> the chain it samples with
        self.generating: set[int] = set()  # seqs that sampled since their chain was built
        self.evaluated = 0  # tokens decoded successfully
        self.steps: list[SchedulerOutput] = []
        self.statuses: list[int] = []  # one per step, beside `steps`
        self.fail_next: int | None = None  # a status the next decode returns
        self.fail_partial = False  # write the batch's cells before failing (a fatal decode may)
        self.drop_sample_for: int | None = None  # "forget" to sample this seq once
        self._scripts: dict[tuple[int, ...], int] = {}
        self.dist: Callable[[Sequence[int]], Sequence[float]] | None = None
        self.draft_model: Callable[[list[int], int], list[int]] | None = None
        self.verified = 0  # draft tokens verified
        self.verifications = 0  # chunks that carried a draft

    def script(self, prompt: Sequence[int], outputs: Sequence[int]) -> None:
        """After `prompt` + outputs[:i], sample outputs[i]."""
        history = list(prompt)
        for token in outputs:
            self._scripts[tuple(history)] = token
            history.append(token)

    def next_token(self, history: list[int]) -> int:
        return self._scripts.get(tuple(history), default_next(history))

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        self.prepare(out)
        return self.decode(out)

    def prepare(self, out: SchedulerOutput) -> None:
        """Memory ops, then sampler frees and setups, as the real runner orders them."""
        self.steps.append(out)
        for op in out.memory_ops:
            if isinstance(op, SeqRemove):
                self.kv.seq_rm(op.seq_id, op.p0, op.p1)
            elif isinstance(op, SeqCopy):
                self.kv.seq_cp(op.src, op.dst, op.p0, op.p1)
        for request_id in out.sampler_drops:
            chain = self.chains.pop(request_id, None)
            for seq in [s for s, c in self.samplers.items() if c is chain]:
                del self.samplers[seq]
                self.generating.discard(seq)
        for setup in out.sampler_setups:
            chain = self.chains.get(setup.request_id)
            if chain is None:
                chain = self.chains[setup.request_id] = FakeChain(setup, rng=random.Random(setup.params.seed))
                self.chains_built += 1
            self.samplers[setup.seq_id] = chain
            self.generating.discard(setup.seq_id)

    def decode(self, out: SchedulerOutput) -> RunnerOutput:
        if not out.chunks:
            self.statuses.append(0)
            return RunnerOutput()
        self._check_batch(out)
        status = self._status(out)
        self.statuses.append(status)
        if status != 0:
            return RunnerOutput(decode_status=status, error=None if status == 1 else f"boom {status}")
        for chunk in out.chunks:
            for i, token in enumerate(chunk.tokens):
                self.kv.add(chunk.seq_id, chunk.start_pos + i, token)
        self.evaluated += out.num_tokens
        return self._sample(out)

    def _check_batch(self, out: SchedulerOutput) -> None:
        seqs = [c.seq_id for c in out.chunks]
        assert len(seqs) == len(set(seqs)), f"a sequence twice in one batch: {seqs}"
        if self.n_batch is not None:
            assert out.num_tokens <= self.n_batch, f"{out.num_tokens} tokens > n_batch {self.n_batch}"
        for chunk in out.chunks:
            assert chunk.tokens, "empty chunk"
            have = len(self.kv.tokens(chunk.seq_id))
            assert chunk.start_pos == have, f"seq {chunk.seq_id}: chunk at {chunk.start_pos}, KV has {have}"
            if chunk.sample:
                assert chunk.seq_id in self.samplers, f"seq {chunk.seq_id} samples without a chain"

    def _status(self, out: SchedulerOutput) -> int:
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            if self.fail_partial:
                for chunk in out.chunks:
                    self.kv.add(chunk.seq_id, chunk.start_pos, chunk.tokens[0])
            return status
        if self.capacity is not None and self.kv.used + out.num_tokens > self.capacity:
            return 1
        return 0

    def _sample(self, out: SchedulerOutput) -> RunnerOutput:
        result = RunnerOutput()
        for chunk in out.chunks:
            if not chunk.sample:
                continue
            if chunk.seq_id == self.drop_sample_for:
                self.drop_sample_for = None
                continue
            chain = self.samplers[chunk.seq_id]
            kv = self.kv.tokens(chunk.seq_id)
            first = chunk.start_pos + len(chunk.tokens) - chunk.n_draft  # history before the draft
            run: list[SampledToken] = []
            for i in range(chunk.n_draft + 1):
                token = self._pick(chain, kv[: first + i])
                run.append(SampledToken(token, piece(token), token == EOG))
                self.generating.add(chunk.seq_id)
                if i == chunk.n_draft or token != chunk.tokens[len(chunk.tokens) - chunk.n_draft + i]:
                    break
            self.verified += chunk.n_draft
            self.verifications += chunk.n_draft > 0
            if chunk.n_draft:
                result.runs[chunk.seq_id] = run
            else:
                result.sampled[chunk.seq_id] = run[0]
        if self.draft_model is not None:
            for ask in out.draft_asks:
                done = result.runs.get(ask.seq_id) or [result.sampled[ask.seq_id]]
                history = list(ask.history) + [t.token for t in done]
                result.drafts[ask.seq_id] = self.draft_model(history, ask.n_max)[: ask.n_max]
        return result

    def _pick(self, chain: FakeChain, history: list[int]) -> int:
        if self.dist is not None:
            weights = self.dist(history)
            token = chain.rng.choices(range(len(weights)), weights=weights)[0]
        else:
            token = self.next_token(history)
        if self.stateful_chains and token != EOG:
            token = 1 + (token + 7 * len(chain.sampled)) % 26
        chain.sampled.append(token)
        return token
