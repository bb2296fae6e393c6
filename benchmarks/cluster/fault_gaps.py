"""The fault matrix's resume gap: for each stream that was producing tokens when a fault hit, the
wait from the end of the fault (broker back, node gone, link restored, worker gone) to its next
token. A stream that ended before the fault did is not counted (nothing of it was left to resume).
"""

from __future__ import annotations

from typing import Any

from benchmarks.cluster.common import ms, pct
from benchmarks.cluster.stream import StreamRecord


def _arrivals(record: StreamRecord) -> list[float]:
    """Its token chunks' arrival times, in seconds since the load began."""
    return [record.start_s + t for t in record.chunk_s]


def resume_gaps(
    records: list[StreamRecord], started: set[int], fault_s: float | None, end_s: float | None
) -> dict[str, Any]:
    """p50 / p99 / max of the gap, over the streams of `started` (in flight at `fault_s`) that had
    a token before the fault and one after its end."""
    if fault_s is None or end_s is None:
        return {"streams": 0, "p50_ms": None, "p99_ms": None, "max_ms": None, "ended_during_fault": 0}
    gaps: list[float] = []
    ended = 0
    for record in records:
        if record.index not in started:
            continue
        times = _arrivals(record)
        if not any(t <= fault_s for t in times):
            continue  # still waiting for a slot when the fault hit: not yet producing tokens
        after = [t for t in times if t >= end_s]
        if not after:
            ended += 1
            continue
        gaps.append(after[0] - end_s)
    return {
        "streams": len(gaps),
        "p50_ms": ms(pct(gaps, 50)),
        "p99_ms": ms(pct(gaps, 99)),
        "max_ms": ms(max(gaps, default=None)),
        "ended_during_fault": ended,
    }
