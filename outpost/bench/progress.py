"""The progress bar on stderr while a level runs: one redrawn line on a terminal, one line per
level otherwise (so logs and CI output stay readable)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

from outpost.bench.records import RequestRecord

REDRAW_S = 0.1  # at most ten redraws a second: drawing must not load the client


class Progress:
    """`start` a level, `update` per finished request, `finish` when the level is done."""

    def __init__(self, stream: TextIO | None = None, width: int = 28) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.width = width
        self._start(label="", total=0, duration=None)

    def _start(self, label: str, total: int, duration: float | None) -> None:
        self.label, self.total, self.duration = label, total, duration
        self.ok = self.err = 0
        self.t0 = self.drawn = time.monotonic()

    def start(self, label: str, total: int, duration: float | None) -> None:
        self._start(label, total, duration)
        if self.tty:
            self._draw()

    def update(self, record: RequestRecord) -> None:
        if record.ok:
            self.ok += 1
        else:
            self.err += 1
        if self.tty and time.monotonic() - self.drawn >= REDRAW_S:
            self._draw()

    def finish(self) -> None:
        self._draw()
        self.stream.write("\n")
        self.stream.flush()

    def log(self, message: str) -> None:
        self.stream.write(message + "\n")
        self.stream.flush()

    def _draw(self) -> None:
        self.drawn = time.monotonic()
        elapsed = self.drawn - self.t0
        done = self.ok + self.err
        if self.duration is not None:  # timed: no total to count against
            frac, goal = min(1.0, elapsed / self.duration), f"{elapsed:5.1f}/{self.duration:g} s"
            count = f"{done} done"
        else:
            frac, goal = done / max(1, self.total), f"{elapsed:5.1f} s"
            count = f"{done}/{self.total}"
        filled = round(frac * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"{self.label} [{bar}] {count} ok {self.ok} err {self.err} {goal}"
        self.stream.write(f"\r{line}\x1b[K" if self.tty else line)  # \x1b[K: clear the old tail
        self.stream.flush()
