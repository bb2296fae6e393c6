"""Errors are counted by status code and exception, never crash the benchmark; rejected extension
fields are dropped by the probe; an unreachable server is a one-line failure."""

from __future__ import annotations

import pytest
from bench_fake_server import FakeConfig, FakeServer, bench

from outpost.bench.client import BenchError
from outpost.bench.failon import check, parse_fail_on


def test_500_429_dropped_truncated_and_short_streams_are_counted_not_fatal() -> None:
    # request 0 is the probe; with one user the measured requests arrive as 1..12 in order
    faults = {2: "500", 3: "429", 5: "drop", 6: "truncate", 8: "stream_error", 9: "short", 11: "500"}
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002, faults=faults)) as fake:
        result = bench([fake.url], "1", 12, output=8)
    s = result.runs[0].summary
    assert s.errors_by_code == {
        "429": 1,
        "500": 2,
        "RemoteProtocolError": 1,  # the connection closed in the middle of the chunked body
        "incomplete_stream": 1,
        "short_output": 1,
        "stream_error": 1,
    }
    assert (s.requests_ok, s.errors) == (5, 7) and s.error_rate == pytest.approx(7 / 12)
    ok = [r for r in result.runs[0].records if r.ok]
    assert len(ok) == 5 and all(r.output_tokens == 8 for r in ok)
    assert s.ttft_s.p50 is not None and s.output_tok_s > 0  # stats over the successful ones only
    failed = {r.index: r for r in result.runs[0].records if not r.ok}
    assert failed[1].status == 500 and "planted" in failed[1].error_detail
    assert failed[2].status == 429


def test_all_requests_failing_gives_empty_stats_not_a_crash() -> None:
    faults = {n: "500" for n in range(1, 5)}
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002, faults=faults)) as fake:
        result = bench([fake.url], "2", 4, output=4)
    s = result.runs[0].summary
    assert (s.requests_ok, s.errors, s.errors_by_code) == (0, 4, {"500": 4})
    assert s.ttft_s.p50 is None and s.output_tok_s == 0.0
    # a gate never passes on missing data: no TTFT to compare counts as crossed
    (violation,) = check(parse_fail_on("ttft_p90>10s"), [s])
    assert violation.observed is None and violation.threshold == "ttft_p90>10s"


def test_rejected_fields_are_dropped_and_not_sent() -> None:
    config = FakeConfig(ttft=0.01, itl=0.002, reject=frozenset({"min_tokens"}))
    with FakeServer(config) as fake:
        result = bench([fake.url], "1", 2, output=4)
        bodies = [r.body for r in fake.measured()]
    accepted = result.servers[0].accepted
    assert (accepted.min_tokens, accepted.ignore_eos, accepted.include_usage) == (False, True, True)
    assert bodies and all("min_tokens" not in b and b["ignore_eos"] is True for b in bodies)
    assert result.runs[0].summary.errors == 0


def test_unreachable_server_is_a_bench_error() -> None:
    with FakeServer() as fake:
        url = fake.url
    with pytest.raises(BenchError, match="cannot reach"):
        bench([url], "1", 1)


def test_a_request_past_the_timeout_is_counted_and_abandoned() -> None:
    with FakeServer(FakeConfig(ttft=0.01, itl=0.01, faults={1: "slow", 2: "slow"})) as fake:
        result = bench([fake.url], "2", 2, output=4, timeout=0.4)
    s = result.runs[0].summary
    assert s.errors_by_code == {"TimeoutError": 2} and s.duration_s < 1.5
