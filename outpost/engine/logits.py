"""Reading a logits row of the last decode as a numpy view, without a copy.

llama_get_logits_ith is called through a prototype that returns the row's address as a plain int
(the bindings' POINTER(c_float) result needs a cast and a fresh array view every token, ~0.03 ms of
a ~4 ms step), and the views are cached by (address, width). A view is only used when llama.cpp
hands out that same address again, so a reallocated logits buffer can never be read stale.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import numpy.typing as npt

from outpost.engine.lib import llama

__all__ = ["logits_row", "row_address"]

_MAX_VIEWS = 64  # rows of live contexts: a few per sequence; cleared when a context moved on


def _logits_ith_returning_address() -> Any:
    address = ctypes.cast(llama.llama_get_logits_ith, ctypes.c_void_p).value
    if not address:
        raise ImportError("libllama has no llama_get_logits_ith")
    return ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32)(address)


_row_address = _logits_ith_returning_address()
_views: dict[tuple[int, int], npt.NDArray[np.float32]] = {}


def row_address(ctx: Any, batch_index: int) -> int:
    """Where the logits of batch position `batch_index` start in llama.cpp's output buffer."""
    address = _row_address(ctx, batch_index)
    if not address:
        raise ValueError(f"no logits were requested for batch index {batch_index}")
    return int(address)


def logits_row(ctx: Any, batch_index: int, n_vocab: int) -> npt.NDArray[np.float32]:
    """The logits the last decode produced for batch position `batch_index`: a view into
    llama.cpp's buffer, valid until the next decode (copy it to keep it)."""
    address = row_address(ctx, batch_index)
    key = (address, n_vocab)
    row = _views.get(key)
    if row is None:
        if len(_views) >= _MAX_VIEWS:
            _views.clear()
        row = np.frombuffer(memoryview((ctypes.c_float * n_vocab).from_address(address)), dtype=np.float32)
        _views[key] = row
    return row
