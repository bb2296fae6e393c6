"""The one door to `llama_cpp`: backend init once, and llama.cpp's log routed through Python.

llama.cpp prints every load detail to stderr by default; Outpost keeps a CLI's stderr for progress
and timings, so the log goes to Python's `logging` (logger "outpost.llama") at DEBUG unless a
caller temporarily installs its own line handler (the quantizer reads per-tensor lines that way).
Which llama.cpp build the bindings load is chosen first (cpu_builds.py), as they read it at import.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from outpost.engine import cpu_builds

CPU_BUILD = cpu_builds.apply()

import llama_cpp as llama  # noqa: E402  (after the choice: the bindings read LLAMA_CPP_LIB_PATH at import)

__all__ = ["CPU_BUILD", "capture_log_lines", "ensure_backend", "llama", "recent_problems"]

_log = logging.getLogger("outpost.llama")
_init_lock = threading.Lock()
_initialised = False
_line_handlers: list[Callable[[str], None]] = []
_partial: list[str] = []
# The last warning/error lines, so a failed load can say *why* instead of "could not load".
_recent_problems: collections.deque[str] = collections.deque(maxlen=8)
_WARN_LEVEL = 3  # ggml_log_level: 1 debug, 2 info, 3 warn, 4 error, 5 continuation
_level = [0]


def _on_log(level: int, text: bytes | None, _user_data: object) -> None:
    if not text:
        return
    chunk = text.decode("utf-8", errors="replace")
    if level != 5:  # a continuation keeps the level of the line it continues
        _level[0] = level
    _partial.append(chunk)
    if not chunk.endswith("\n"):
        return  # llama.cpp streams progress dots without newlines; wait for the line's end
    line = "".join(_partial).rstrip("\n")
    _partial.clear()
    if _level[0] >= _WARN_LEVEL:
        _recent_problems.append(line.strip())
    for handler in list(_line_handlers):
        handler(line)
    _log.debug("%s", line)


# Keep a reference for the process lifetime: llama.cpp holds the raw function pointer.
_LOG_CALLBACK = llama.llama_log_callback(_on_log)


def ensure_backend() -> None:
    """Initialise llama.cpp's backend and log routing once per process (idempotent, thread-safe)."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        llama.llama_log_set(_LOG_CALLBACK, None)
        llama.llama_backend_init()
        _initialised = True


@contextlib.contextmanager
def capture_log_lines(handler: Callable[[str], None]) -> Iterator[None]:
    """Call `handler(line)` for each llama.cpp log line while the block runs."""
    ensure_backend()
    _line_handlers.append(handler)
    try:
        yield
    finally:
        _line_handlers.remove(handler)


def recent_problems() -> str:
    """The last few llama.cpp warnings/errors, joined on one line (for error messages)."""
    return " | ".join(_recent_problems)
