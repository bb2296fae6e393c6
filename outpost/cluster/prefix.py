"""Prompt prefixes as chains of block hashes: what a worker holds in its KV cache, what a gateway asks.

A token sequence is cut into blocks of `BLOCK` tokens; block i's hash covers every token before its
end (each hash folds in the previous one, as vLLM's prefix cache does), so two sequences share
hash i exactly when they share their first (i + 1) * BLOCK tokens. A worker advertises the hashes
of what its slots hold; a gateway hashes a prompt the same way and finds the worker holding its
longest prefix with set lookups, without any shared routing state. Hashes are 64-bit blake2b
digests as hex, so they cross the broker as plain JSON strings.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Sequence

BLOCK = 64  # tokens per hashed block: fine enough for system prompts, few hashes per sequence
MAX_ADVERTISED = 4096  # hashes a worker advertises at most (about 64 KB of heartbeat)


def block_hashes(tokens: Sequence[int], max_blocks: int | None = None) -> list[str]:
    """The chained hashes of the full blocks of `tokens` (a partial last block is not hashed)."""
    n_blocks = len(tokens) // BLOCK
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    hashes: list[str] = []
    previous = b""
    for i in range(n_blocks):
        block = array("i", tokens[i * BLOCK : (i + 1) * BLOCK]).tobytes()
        digest = hashlib.blake2b(previous + block, digest_size=8).digest()
        hashes.append(digest.hex())
        previous = digest
    return hashes


def matched_blocks(prompt_hashes: Sequence[str], held: set[str] | frozenset[str]) -> int:
    """How many leading blocks of the prompt a holder of `held` has (chained: stop at the first miss)."""
    n = 0
    for h in prompt_hashes:
        if h not in held:
            break
        n += 1
    return n


class PrefixIndex:
    """A worker's advertised hashes, recomputed only for sequences that changed."""

    def __init__(self, limit: int = MAX_ADVERTISED) -> None:
        self.limit = limit
        self._memo: dict[tuple[int, ...], list[str]] = {}

    def hashes(self, sequences: Iterable[Sequence[int]]) -> list[str]:
        """The union of every sequence's block hashes (leading blocks first), at most `limit`."""
        memo: dict[tuple[int, ...], list[str]] = {}
        per_sequence: list[list[str]] = []
        for seq in sequences:
            key = tuple(seq[: (len(seq) // BLOCK) * BLOCK])
            if not key:
                continue
            found = self._memo.get(key)
            if found is None:
                found = block_hashes(key)
            memo[key] = found
            per_sequence.append(found)
        self._memo = memo  # forget sequences no slot holds any more
        out: list[str] = []
        seen: set[str] = set()
        depth = 0
        # Round-robin over depths, so a cap keeps every sequence's leading blocks.
        while len(out) < self.limit and any(depth < len(h) for h in per_sequence):
            for hashes in per_sequence:
                if depth < len(hashes) and hashes[depth] not in seen:
                    seen.add(hashes[depth])
                    out.append(hashes[depth])
            depth += 1
        return out[: self.limit]
