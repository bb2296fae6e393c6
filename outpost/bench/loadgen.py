"""Applying load: closed loop (N users, each sends its next request when its last one finishes) and
open loop (Poisson arrivals at R requests/s, whatever is still in flight).

Both are bounded twice: by the prompt list (one request per prompt at most) and by the optional
duration (no request starts after it; those in flight finish, each bounded by the client timeout).
Time is the running event loop's clock (`loop.time()`, monotonic), so a test can run a phase on a
loop whose clock is virtual and check schedules exactly, whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from outpost.bench.config import Mode
from outpost.bench.prompts import Prompt
from outpost.bench.records import RequestRecord

# (prompt, seconds since the level started) -> the finished record
SendFn = Callable[[Prompt, float], Awaitable[RequestRecord]]
OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class Phase:
    """One level against one server: `prompts` bounds the request count."""

    mode: Mode
    level: float
    prompts: Sequence[Prompt]
    duration: float | None
    ramp_up: float = 0.0  # closed loop: user u starts u * ramp_up / users seconds in


@dataclass
class PhaseOutcome:
    records: list[RequestRecord]
    capped: bool  # a timed phase that used every prompt before its time was up


def arrival_rng(seed: int, level_index: int) -> random.Random:
    """The generator of a level's arrival times: the same for every server, so all get one schedule."""
    return random.Random(f"{seed}:{level_index}:arrivals")


def poisson_arrivals(rate: float, count: int, rng: random.Random) -> list[float]:
    """Arrival offsets (s) of a Poisson process at `rate`/s: the first at 0, then exponential gaps."""
    times, t = [], 0.0
    for _ in range(count):
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _clock() -> Callable[[], float]:
    return asyncio.get_running_loop().time


async def run_phase(phase: Phase, send: SendFn, rng: random.Random, on_record: OnRecord) -> PhaseOutcome:
    now = _clock()
    t0 = now()
    if phase.mode == "concurrency":
        records = await _closed(int(phase.level), phase, send, t0, on_record)
    else:
        records = await _open(phase, send, rng, t0, on_record)
    elapsed = now() - t0
    capped = phase.duration is not None and len(records) == len(phase.prompts) and elapsed < phase.duration
    return PhaseOutcome(sorted(records, key=lambda r: r.index), capped)


async def _closed(
    users: int, phase: Phase, send: SendFn, t0: float, on_record: OnRecord
) -> list[RequestRecord]:
    queue: Iterator[Prompt] = iter(phase.prompts)  # shared: the next prompt goes to whichever user is free
    records: list[RequestRecord] = []
    clock = _clock()

    async def user(u: int) -> None:
        start = u * phase.ramp_up / users
        if phase.duration is not None and start >= phase.duration:
            return
        await asyncio.sleep(start)
        for prompt in queue:
            now = clock() - t0
            if phase.duration is not None and now >= phase.duration:
                return
            record = await send(prompt, now)
            records.append(record)
            on_record(record)

    await asyncio.gather(*(user(u) for u in range(users)))
    return records


async def _open(
    phase: Phase, send: SendFn, rng: random.Random, t0: float, on_record: OnRecord
) -> list[RequestRecord]:
    async def fire(prompt: Prompt, now: float) -> RequestRecord:
        record = await send(prompt, now)
        on_record(record)
        return record

    clock = _clock()
    tasks: list[asyncio.Task[RequestRecord]] = []
    for prompt, at in zip(phase.prompts, poisson_arrivals(phase.level, len(phase.prompts), rng), strict=True):
        if phase.duration is not None and at >= phase.duration:
            break
        delay = at - (clock() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(fire(prompt, clock() - t0)))
    return list(await asyncio.gather(*tasks))
