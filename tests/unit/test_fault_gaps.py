"""The fault matrix's resume gap (benchmarks/cluster/fault_gaps.py) and its table column, on made-up
streams: which streams count, and what their gap is."""

from __future__ import annotations

from benchmarks.cluster.fault_gaps import resume_gaps
from benchmarks.cluster.faults_report import HEADER, fault_table
from benchmarks.cluster.stream import StreamRecord


def _stream(index: int, start_s: float, chunks: list[float]) -> StreamRecord:
    record = StreamRecord(index, 0, start_s, 64)
    record.chunk_s = chunks  # since the stream's own start
    return record


def test_the_gap_runs_from_the_faults_end_to_each_interrupted_streams_next_token() -> None:
    fault, end = 10.0, 14.0
    records = [
        _stream(0, 8.0, [0.5, 1.0, 6.5, 7.0]),  # tokens at 8.5, 9.0, then 14.5: 0.5 s after the end
        _stream(1, 9.0, [0.2, 8.0]),  # 9.2, then 17.0: 3 s
        _stream(2, 9.5, [1.0, 2.0]),  # its first token came during the fault: was waiting for a slot
        _stream(3, 9.0, [0.5, 1.5]),  # 9.5 then 10.5, and done before the end: nothing to resume
        _stream(4, 12.0, [3.0]),  # started during the fault: not in flight when it hit
    ]
    gaps = resume_gaps(records, {0, 1, 2, 3}, fault, end)
    assert gaps["streams"] == 2 and gaps["ended_during_fault"] == 1
    assert gaps["max_ms"] == 3000.0 and 500.0 <= gaps["p50_ms"] <= 3000.0
    assert resume_gaps(records, {0, 1}, None, None)["streams"] == 0  # no fault ran


def test_the_table_shows_the_gap_beside_the_pauses() -> None:
    pauses = {"streams": 2, "p50_ms": 40.0, "p99_ms": 900.0, "max_ms": 900.0}
    run = {
        "requests": 10,
        "ok": 10,
        "clear_errors": 0,
        "without_final_outcome": 0,
        "duplicated_tokens": 0,
        "missing_tokens": 0,
        "refused_503_retried": 0,
        "success_with_retry_pct": 100.0,
        "in_flight_at_fault": 4,
        "in_flight_at_fault_ok": 4,
        "pause_all": pauses,
        "pause_at_fault": pauses,
        "resume_gap": {"streams": 3, "p50_ms": 120.0, "p99_ms": 2500.0},
    }
    row = fault_table({"worker-kill": run}).splitlines()[2].split(" | ")
    assert len(row) == len(HEADER) and row[0] == "| worker-kill"
    assert row[-1] == "120.0 / 2500.0 (3) |"
