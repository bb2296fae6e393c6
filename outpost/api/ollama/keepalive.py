"""Ollama's `keep_alive` on a server whose models load on demand: how long a model stays loaded once
idle after a request (a number of seconds or a Go duration such as "5m", "1h30m", "300ms"; 0 unloads
it when the request ends, a negative value keeps it until unloaded), and the empty requests Ollama
loads (`ollama run`) and unloads (`ollama stop`: `keep_alive: 0`) a model with.

Where the server keeps its one model loaded (one -m without --sleep-idle-seconds), `keep_alive` is
read and changes nothing, as docs/ollama.md says.
"""

from __future__ import annotations

import re

from outpost.api.ollama.translate import bad
from outpost.backend import InferenceBackend, ManagedBackend

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def keep_alive_seconds(value: str | int | float | None) -> float | None:
    """Seconds, or None where the request gives none (the server's rule then)."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    text = value.strip()
    try:
        return float(text)  # "0", "-1", "300": seconds, as Ollama takes them
    except ValueError:
        pass
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.removeprefix("+"))
    parts = _PART.findall(body)
    if not body or "".join(n + u for n, u in parts) != body:
        raise bad(f'keep_alive: {value!r} is not a duration (e.g. "5m", "1h", 0 to unload, -1 to keep)')
    return sign * sum(float(n) * _UNITS[u] for n, u in parts)


def apply_keep_alive(backend: InferenceBackend | None, seconds: float | None) -> None:
    """The request's keep_alive for its model (None: not served here), from the end of this request on."""
    if seconds is not None and isinstance(backend, ManagedBackend):
        backend.keep_for(seconds)


async def load_or_unload(backend: InferenceBackend, seconds: float | None) -> str:
    """An empty request: unload the model (keep_alive 0) or load it; the `done_reason` to answer.
    The request's keep_alive is its model's already (`apply_keep_alive`, as for every request)."""
    if not isinstance(backend, ManagedBackend):
        return "load"  # always loaded here
    if seconds == 0:
        await backend.unload()
        return "unload"
    await backend.load()
    return "load"
