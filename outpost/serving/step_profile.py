"""The engine's step profile: where each decoding step's time goes, as JSON lines for benchmarks.

`OUTPOST_STEP_PROFILE=FILE` (a diagnostic knob, as OUTPOST_DEBUG_STEP_DELAY_MS is a test one) makes
every engine core append one record per step that decodes: its width (sequences decoding one token,
prompt tokens read, runs of consecutive seq ids) and the milliseconds spent waiting before it (the
lock, jobs, the GIL: `wait`), scheduling, in `llama_decode`, in the rest of the runner (sampling,
memory ops, the batch), updating the scheduler and handing events to their sinks. About once a
second it appends each thread's CPU seconds, so the HTTP/SSE side (the event loop's thread) shows
beside the engine's and llama.cpp's worker threads. `python -m benchmarks.serve.steps FILE` reads
it. A file, not a metric: it is only written when asked for.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import IO

from outpost.scheduler.output import SchedulerOutput

PROFILE_ENV = "OUTPOST_STEP_PROFILE"
CPU_EVERY_S = 1.0  # how often the threads' CPU seconds are written


def profile_from_env() -> StepProfile | None:
    """The profile OUTPOST_STEP_PROFILE asks for (appending to its file), or None when unset."""
    path = os.environ.get(PROFILE_ENV, "").strip()
    return StepProfile(Path(path)) if path else None


def thread_cpu_seconds() -> dict[int, float]:
    """User + system CPU seconds of each of this process's threads, by native id (Linux's /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for task in Path("/proc/self/task").glob("*"):
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended while we looked
            continue
        out[int(task.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


class StepProfile:
    """Writes the records; `bind()` on the engine thread first, `record()` after each step."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self._engine_tid = 0
        self._last_end: float | None = None
        self._next_cpu = 0.0

    def bind(self) -> None:
        """Marks the calling thread as the engine's (its CPU is told apart from the others')."""
        self._engine_tid = threading.get_native_id()
        self._write({"start": time.time(), "pid": os.getpid(), "engine_tid": self._engine_tid})

    def record(self, out: SchedulerOutput, decode_s: float, marks: tuple[float, ...]) -> None:
        """marks: perf_counter at the step's start, after schedule, execute, update and the sinks."""
        start, scheduled, executed, updated, emitted = marks
        wait = 0.0 if self._last_end is None else start - self._last_end
        self._last_end = emitted
        decoding = [c for c in out.chunks if c.sample and len(c.tokens) == 1 + c.n_draft]
        n_prompt = sum(len(c.tokens) for c in out.chunks) - sum(len(c.tokens) for c in decoding)
        n_decode = len(decoding)
        self._write(
            {
                "t": round(emitted, 6),
                "decode": n_decode,
                "prompt": n_prompt,
                "runs": seq_id_runs(out),
                "wait": _ms(wait),
                "schedule": _ms(scheduled - start),
                "llama_decode": _ms(decode_s),
                "runner": _ms(executed - scheduled - decode_s),
                "update": _ms(updated - executed),
                "emit": _ms(emitted - updated),
            }
        )
        if emitted >= self._next_cpu:
            self._next_cpu = emitted + CPU_EVERY_S
            self.write_cpu(emitted)

    def write_cpu(self, now: float) -> None:
        """Each thread's CPU seconds so far, by role: the engine, the main thread (where the server's
        event loop runs) and the others (llama.cpp's workers, thread pools)."""
        main, engine = os.getpid(), self._engine_tid
        roles = {"engine": 0.0, "main": 0.0, "other": 0.0}
        for tid, seconds in thread_cpu_seconds().items():
            roles["engine" if tid == engine else "main" if tid == main else "other"] += seconds
        self._write({"t": round(now, 6), "cpu": {k: round(v, 3) for k, v in roles.items()}})

    def close(self) -> None:
        self.write_cpu(time.perf_counter())
        self._file.close()

    def _write(self, record: dict[str, object]) -> None:
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")


def seq_id_runs(out: SchedulerOutput) -> int:
    """Runs of consecutive seq ids in the step's batch: with a KV stream per slot, llama.cpp decodes
    each run as a micro-batch of its own (llama_batch_allocr::split_equal, sequential)."""
    ids = sorted({c.seq_id for c in out.chunks})
    return sum(1 for i, seq in enumerate(ids) if i == 0 or seq != ids[i - 1] + 1)


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)
