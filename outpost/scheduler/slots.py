"""The slot pool: what each llama.cpp sequence holds in the KV cache, and how many cells that is.

Slot i is sequence id i. `Slot.cached` is exactly the tokens whose KV sits in that sequence at
positions 0..len-1; it changes only with the memory ops the scheduler emits (applied, in order,
before the step's decode) and with chunks that were decoded successfully.

In a unified cache `llama_memory_seq_cp` makes two sequences share cells rather than copy them
(with a stream per slot the runner copies, and the count below is a lower bound that never
matters: each slot is then bounded by its own stream). To count cells exactly, each slot also
keeps `runs`: its positions split into runs of cells that were created together (same
`origin`). A copy shares the source's runs; evaluating new tokens creates (or extends) a run of
the slot's own. All runs of one origin start at the same position (copies and truncations only
cut their ends), so the cells in use are, per origin, the positions from its start to the
furthest end any slot still holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from outpost.messages import LoraScales

# Block size for the prefix comparison: big slices compare in C, the last block in Python.
_LCP_BLOCK = 256


def common_prefix_len(a: list[int], b: list[int], limit: int) -> int:
    """Length of the longest common prefix of `a` and `b`, at most `limit`.

    O(prefix length) with the work done by list slice comparison (C); called only at admission.
    """
    n = min(len(a), len(b), limit)
    if n <= 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:  # the common case for a shared system prompt: one comparison
        return n
    i = 0
    while i + _LCP_BLOCK <= n and a[i : i + _LCP_BLOCK] == b[i : i + _LCP_BLOCK]:
        i += _LCP_BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(slots=True)
class Run:
    """Positions [start, end) of a sequence whose cells were all created as `origin`."""

    origin: int
    start: int
    end: int


@dataclass(eq=False, slots=True)
class Slot:
    """One sequence id and the tokens its KV holds."""

    seq_id: int
    cached: list[int] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    # The origin this slot may extend in place: its own fresh cells, not cut since.
    own_origin: int | None = None
    busy: bool = False  # a request holds the slot
    # The LoRA settings its cached KV was computed under: only a request with the same ones may
    # reuse it (another adapter gives other keys and values). Set by the request that fills it.
    lora: LoraScales = ()
    last_used: int = 0  # LRU clock tick of the last assignment or release

    def append(self, tokens: list[int], new_origin: int) -> None:
        """Tokens were decoded at the end of this sequence: new cells.

        `new_origin` is used only if the slot cannot extend its own run in place."""
        n0 = len(self.cached)
        self.cached.extend(tokens)
        last = self.runs[-1] if self.runs else None
        if last is not None and last.origin == self.own_origin and last.end == n0:
            last.end = len(self.cached)
        else:
            self.runs.append(Run(new_origin, n0, len(self.cached)))
            self.own_origin = new_origin

    def truncate(self, length: int) -> None:
        """`seq_rm(seq, length, -1)`: keep positions [0, length)."""
        if length >= len(self.cached):
            return
        del self.cached[length:]
        while self.runs and self.runs[-1].start >= length:
            self.runs.pop()
        if self.runs:
            self.runs[-1].end = min(self.runs[-1].end, length)
        # Another slot may still hold this origin's cells past `length`: new tokens get new cells.
        self.own_origin = None

    def clear(self) -> None:
        """`seq_rm(seq, -1, -1)`: the sequence holds nothing."""
        self.cached = []
        self.runs = []
        self.own_origin = None
        self.lora = ()

    def share_from(self, src: Slot, length: int) -> None:
        """`seq_rm(dst)` then `seq_cp(src, dst, 0, length)`: share src's first `length` cells."""
        self.cached = src.cached[:length]
        self.lora = src.lora
        self.runs = [Run(r.origin, r.start, min(r.end, length)) for r in src.runs if r.start < length]
        self.own_origin = None


def cells_used(slots: list[Slot]) -> int:
    """KV cells held by any sequence; shared cells count once. O(total runs)."""
    spans: dict[int, tuple[int, int]] = {}
    for slot in slots:
        for run in slot.runs:
            seen = spans.get(run.origin)
            if seen is None or run.end > seen[1]:
                spans[run.origin] = (run.start, run.end)
    return sum(end - start for start, end in spans.values())
