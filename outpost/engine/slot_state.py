"""One sequence's KV to and from a file: llama.cpp's `llama_state_seq_save_file` / `_load_file`.

What llama-server's `/slots/{id}?action=save|restore` call: the file holds the sequence's tokens
(a header) and its KV cells, so a restored sequence is a prefix cache the next request with the
same prompt start reuses. Engine thread only (it reads and writes the llama context).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from outpost.engine.lib import llama
from outpost.engine.model import LoadedModel


def save_sequence(model: LoadedModel, seq_id: int, tokens: list[int], path: Path) -> int:
    """Writes `seq_id`'s KV and `tokens` (what it holds) to `path`; returns the bytes written."""
    array = (llama.llama_token * max(1, len(tokens)))(*tokens)
    written = int(llama.llama_state_seq_save_file(model.ctx, str(path).encode(), seq_id, array, len(tokens)))
    if written == 0:
        raise OSError(f"llama.cpp could not write the slot file {path.name}")
    return written


def token_count(model: LoadedModel, path: Path) -> int | None:
    """The tokens a slot file holds (read from its header only), or None if it is not one."""
    n = ctypes.c_size_t(0)
    if llama.llama_state_seq_load_file(model.ctx, str(path).encode(), 0, None, 0, ctypes.byref(n)) == 0:
        return None
    return int(n.value)


def load_sequence(model: LoadedModel, seq_id: int, path: Path, n_tokens: int) -> tuple[list[int], int]:
    """Reads `path` into `seq_id` (which must be empty): its tokens and the bytes read; (_, 0) when
    llama.cpp refused it (no room in the KV cache, or not a file of this model)."""
    array = (llama.llama_token * max(1, n_tokens))()
    n = ctypes.c_size_t(0)
    read = int(
        llama.llama_state_seq_load_file(
            model.ctx, str(path).encode(), seq_id, array, max(1, n_tokens), ctypes.byref(n)
        )
    )
    return list(array[: n.value]), read


def clear_sequence(model: LoadedModel, seq_id: int) -> None:
    llama.llama_memory_seq_rm(model.memory, seq_id, -1, -1)
