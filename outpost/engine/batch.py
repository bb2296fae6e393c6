"""A `llama_batch` whose arrays are numpy buffers, filled a chunk at a time (never token by token).

llama_batch_init allocates one seq_id array per token; here all seq ids live in one contiguous
int32 array and the per-token pointers are set once, so filling a step costs a few numpy slice
writes per chunk, independent of the token count.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from outpost.engine.lib import llama
from outpost.scheduler.output import BatchChunk


class TokenBatch:
    """Reusable batch of up to `capacity` tokens across any number of sequences."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.tokens: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.pos: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id: npt.NDArray[np.int32] = np.ones(capacity, dtype=np.int32)
        self.seq_ids: npt.NDArray[np.int32] = np.zeros(capacity, dtype=np.int32)
        self.logits: npt.NDArray[np.int8] = np.zeros(capacity, dtype=np.int8)
        self._arange: npt.NDArray[np.int32] = np.arange(capacity, dtype=np.int32)
        int32_p = ctypes.POINTER(ctypes.c_int32)
        base = self.seq_ids.ctypes.data
        self._seq_id_ptrs = (int32_p * capacity)(
            *[ctypes.cast(base + 4 * i, int32_p) for i in range(capacity)]
        )
        # Typed as Any: the bindings annotate these fields as arrays, but C wants pointers here.
        struct: Any = llama.llama_batch()
        self.struct = struct
        struct.n_tokens = 0
        struct.token = self.tokens.ctypes.data_as(ctypes.POINTER(llama.llama_token))
        struct.embd = None
        struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(llama.llama_pos))
        struct.n_seq_id = self.n_seq_id.ctypes.data_as(int32_p)
        struct.seq_id = ctypes.cast(self._seq_id_ptrs, ctypes.POINTER(int32_p))
        struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))

    def fill(self, chunks: Sequence[BatchChunk]) -> dict[int, int]:
        """Lay the chunks out back to back; returns seq_id -> batch index of its sampled output
        (with a draft: of the first of its n_draft + 1 consecutive outputs)."""
        offset = 0
        outputs: dict[int, int] = {}
        for chunk in chunks:
            n = len(chunk.tokens)
            end = offset + n
            if end > self.capacity:
                raise ValueError(f"batch of {end} tokens exceeds capacity {self.capacity}")
            if n == 1:
                # A decode token: four scalar stores cost a fraction of the slice writes below.
                self.tokens[offset] = chunk.tokens[0]
                self.pos[offset] = chunk.start_pos
                self.seq_ids[offset] = chunk.seq_id
                self.logits[offset] = chunk.sample
                if chunk.sample:
                    outputs[chunk.seq_id] = offset
                offset = end
                continue
            self.tokens[offset:end] = chunk.tokens
            np.add(self._arange[:n], chunk.start_pos, out=self.pos[offset:end])
            self.seq_ids[offset:end] = chunk.seq_id
            self.logits[offset:end] = 0
            if chunk.sample:
                # A draft wants logits at its last token and each draft token (see BatchChunk).
                first = end - 1 - chunk.n_draft
                self.logits[first:end] = 1
                outputs[chunk.seq_id] = first
            offset = end
        self.struct.n_tokens = offset
        return outputs
