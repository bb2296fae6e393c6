"""A stderr progress bar for long command-line tasks (synth, quantize, convert, the demo model)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def progress_bar(desc: str) -> Callable[[int, int, str], None]:
    """A stderr progress callback `(done, total, label)` for long tasks."""
    from tqdm import tqdm

    bar: list[Any] = []

    def update(done: int, total: int, label: str) -> None:
        if not bar:
            bar.append(tqdm(total=total, desc=desc, unit="tensor", file=sys.stderr, leave=True))
        bar[0].set_postfix_str(label[:40], refresh=False)
        bar[0].update(done - bar[0].n)
        if done >= total:
            bar[0].close()

    return update
