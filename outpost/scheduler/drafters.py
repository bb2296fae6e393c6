"""Drafts without a second model: the request's own tokens predict its next ones (prompt lookup).

Two drafters, after llama.cpp's own (common/ngram-map.cpp, common/ngram-mod.cpp in the pinned
source), with their defaults:

- `ngram-simple`: the last `size_n` tokens (the one just sampled included) are looked up in the
  request's history, latest match first; the up to `size_m` tokens that followed it are the draft.
  As in llama.cpp a draft shorter than `size_n` is not offered. Unlike llama.cpp, a match followed
  by fewer than `size_n` tokens is passed over for an earlier one rather than ending the search:
  in text that repeats with a period under `size_n` (a small model's loop, a table's rows) the
  latest match always lies one period back, so llama.cpp never drafts there. Where llama.cpp
  scans the history token by token every step, this keeps an index of where each token occurs
  (updated as tokens arrive), so a lookup compares only the slices that end in the last token.
- `ngram-mod`: one table shared by every request maps each `n_match` tokens to the token that
  followed them last (llama.cpp hashes into 4M fixed buckets; a dict is the same without
  collisions). A draft is chained through the table from the last `n_match` tokens, at most `n_max`
  long, and dropped if shorter than `n_min`. Prompts are added at admission, generated text in
  chunks of 32 tokens; the table is cleared when it grows past 1M entries (llama.cpp: 25% of its
  buckets) or after 5 drafts in a row with under a quarter accepted.

Pure and deterministic: the scheduler calls them with token lists and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class Drafter(Protocol):
    """Proposes draft tokens for a request from its history (prompt + output, the last sampled
    token last). `begin` at first admission, `end` when the request ends."""

    def begin(self, request_id: str, prompt: list[int]) -> None: ...

    def propose(self, request_id: str, history: list[int], n_max: int) -> list[int]: ...

    def accept(self, request_id: str, n_drafted: int, n_accepted: int) -> None: ...

    def end(self, request_id: str) -> None: ...


@dataclass
class _History:
    """Where each token occurs in one request's history, for the first `n_indexed` tokens."""

    where: dict[int, list[int]] = field(default_factory=dict)
    n_indexed: int = 0

    def extend(self, history: list[int]) -> None:
        where = self.where
        for pos in range(self.n_indexed, len(history)):
            where.setdefault(history[pos], []).append(pos)
        self.n_indexed = len(history)


class NgramSimple:
    """llama-server's `ngram-simple` (see the module docstring)."""

    def __init__(self, size_n: int = 12, size_m: int = 48) -> None:
        if size_n < 1 or size_m < 1:
            raise ValueError(f"ngram-simple sizes must be at least 1 (got n={size_n}, m={size_m})")
        self.size_n = size_n
        self.size_m = size_m
        self._seqs: dict[str, _History] = {}

    def begin(self, request_id: str, prompt: list[int]) -> None:
        self._seqs[request_id] = _History()

    def propose(self, request_id: str, history: list[int], n_max: int) -> list[int]:
        n, m = self.size_n, min(self.size_m, n_max)
        cur_len = len(history) - 1  # llama.cpp's prompt excludes the token just sampled
        if m < n or cur_len <= n + self.size_m + 1:  # m < n: any draft would be under the n-gram
            return []
        index = self._seqs.setdefault(request_id, _History())
        index.extend(history)
        pattern = history[-n:]
        # A match is history[j : j + n] with 1 <= j <= cur_len - n - 1, the latest first; it ends
        # at e = j + n - 1, where the last token occurs.
        ends = index.where.get(history[-1], ())
        for e in reversed(ends):
            j = e - n + 1
            if j > cur_len - n - 1:
                continue
            if j < 1:
                break
            if history[j : e + 1] == pattern:
                copy = min(m, cur_len - (j + n))
                if copy >= n:  # else too close to the end to draft from: an earlier match may not be
                    return history[j + n : j + n + copy]
        return []

    def accept(self, request_id: str, n_drafted: int, n_accepted: int) -> None:
        pass

    def end(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)


# llama.cpp clears its 4M-bucket table above 25% occupancy.
NGRAM_MOD_MAX_ENTRIES = 1 << 20
_ADD_CHUNK = 32  # generated tokens are added to the table in chunks of this many
_LOW_ACCEPTANCE = 0.25
_LOW_STREAK = 5


@dataclass
class _ModSeq:
    i_last: int = 0  # history[:i_last + n] is in the table
    n_low: int = 0  # drafts in a row with under a quarter accepted


class NgramMod:
    """llama-server's `ngram-mod` (see the module docstring)."""

    def __init__(self, n_match: int = 24, n_max: int = 64, n_min: int = 48) -> None:
        if n_match < 1 or not 0 <= n_min <= n_max:
            raise ValueError(
                f"ngram-mod needs n_match >= 1 and 0 <= n_min <= n_max (got {n_match}, {n_min}, {n_max})"
            )
        self.n = n_match
        self.n_max = n_max
        self.n_min = n_min
        self.table: dict[tuple[int, ...], int] = {}
        self._seqs: dict[str, _ModSeq] = {}

    def _add(self, tokens: list[int], start: int, stop: int) -> None:
        n, table = self.n, self.table
        for i in range(start, stop):
            table[tuple(tokens[i : i + n])] = tokens[i + n]

    def begin(self, request_id: str, prompt: list[int]) -> None:
        seq = self._seqs[request_id] = _ModSeq()
        if len(prompt) < self.n:
            return
        self._add(prompt, 0, len(prompt) - self.n)
        seq.i_last = len(prompt) - self.n
        if len(self.table) > NGRAM_MOD_MAX_ENTRIES:
            self.table.clear()

    def propose(self, request_id: str, history: list[int], n_max: int) -> list[int]:
        n = self.n
        seq = self._seqs.setdefault(request_id, _ModSeq())
        cur_len = len(history) - 1  # llama.cpp's prompt excludes the token just sampled
        if cur_len < n:
            return []
        if seq.i_last + _ADD_CHUNK < cur_len:
            self._add(history, seq.i_last, cur_len - n)
            seq.i_last = cur_len - n
        limit = min(self.n_max, n_max)
        window = history[-n:]
        draft: list[int] = []
        table = self.table
        for i in range(limit):
            token = table.get(tuple(window[i : i + n]))
            if token is None:
                break
            draft.append(token)
            window.append(token)
        # llama.cpp's n_min is checked against its own n_max: a draft cut by the request's
        # smaller limit still counts once it reaches that limit.
        if len(draft) < min(self.n_min, limit):
            return []
        return draft

    def accept(self, request_id: str, n_drafted: int, n_accepted: int) -> None:
        seq = self._seqs.get(request_id)
        if seq is None or n_drafted <= 0:
            return
        if n_accepted / n_drafted < _LOW_ACCEPTANCE:
            seq.n_low += 1
            if seq.n_low >= _LOW_STREAK:
                self.table.clear()
                seq.n_low = 0
                seq.i_last = 0
        else:
            seq.n_low = 0

    def end(self, request_id: str) -> None:
        self._seqs.pop(request_id, None)


def make_drafter(spec_type: str, ngram_simple: tuple[int, int] = (12, 48)) -> Drafter | None:
    """The drafter for a `SpecParams.type` the scheduler runs itself (None: none, or the draft
    model, which the runner drives)."""
    if spec_type == "ngram-simple":
        return NgramSimple(*ngram_simple)
    if spec_type == "ngram-mod":
        return NgramMod()
    return None
