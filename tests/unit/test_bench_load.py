"""Load shapes: closed loop keeps exactly N requests in flight, open loop fires on its Poisson
schedule whatever is in flight, --duration stops new requests, --ramp-up starts closed-loop users
one by one, --compare alternates servers."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics

from bench_fake_server import FakeConfig, FakeServer, bench

from outpost.bench.loadgen import Phase, arrival_rng, poisson_arrivals, run_phase
from outpost.bench.prompts import Prompt
from outpost.bench.records import RequestRecord


def test_poisson_arrivals_have_exponential_gaps_and_are_seeded() -> None:
    times = poisson_arrivals(4.0, 4000, random.Random(1))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert abs(statistics.mean(gaps) - 0.25) < 0.25 * 0.06
    assert abs(statistics.stdev(gaps) / statistics.mean(gaps) - 1.0) < 0.1  # exponential: CV 1
    assert poisson_arrivals(4.0, 50, random.Random(1)) == times[:50]
    assert poisson_arrivals(4.0, 50, random.Random(2)) != times[:50]


def test_open_loop_fires_on_schedule_without_waiting_for_replies() -> None:
    with FakeServer(FakeConfig(ttft=0.4, itl=0.01)) as fake:
        result = bench([fake.url], None, 12, output=3, rate="15")
        arrivals = [r.at for r in fake.measured()]
        most = fake.max_in_flight
    planned = poisson_arrivals(15.0, 12, arrival_rng(7, 0))
    offsets = [a - arrivals[0] for a in arrivals]
    assert max(abs(o - p) for o, p in zip(offsets, planned, strict=True)) < 0.05, (offsets, planned)
    # replies take 0.42 s and arrivals come every ~67 ms: a closed loop could never overlap them
    assert most >= 3
    s = result.runs[0].summary
    assert s.mode == "rate" and s.level == 15 and s.requests_ok == 12
    assert s.summary_entry()["rate"] == 15.0 and "concurrency" not in s.summary_entry()


def test_closed_loop_holds_exactly_n_in_flight() -> None:
    with FakeServer(FakeConfig(ttft=0.05, itl=0.01)) as fake:
        result = bench([fake.url], "3", 9, output=4)
        most = fake.max_in_flight
    assert most == 3
    assert result.runs[0].summary.requests_ok == 9


def _first_starts(ramp_up: float, users: int) -> list[float]:
    """Each user's first send, in seconds since the phase began; no reply comes back before every
    user has sent its first, so no user can take another's place in the order."""
    prompts = [Prompt(i, None, "hi", 1, 1) for i in range(2 * users)]
    starts: list[float] = []

    async def run() -> None:
        everyone_in = asyncio.Event()

        async def send(prompt: Prompt, now: float) -> RequestRecord:
            starts.append(now)
            if len(starts) == users:
                everyone_in.set()
            await everyone_in.wait()
            return RequestRecord(prompt.index, now, 1, 1)

        phase = Phase("concurrency", users, prompts, None, ramp_up)
        outcome = await run_phase(phase, send, random.Random(0), lambda r: None)
        assert len(outcome.records) == 2 * users

    asyncio.run(asyncio.wait_for(run(), 30))
    return starts[:users]


def test_ramp_up_starts_closed_loop_users_one_by_one() -> None:
    users, ramp = 4, 0.4
    starts = _first_starts(ramp, users)
    # asyncio never wakes a sleeper early (beyond its clock's resolution): a lower bound holds anywhere
    assert all(s >= k * ramp / users - 0.005 for k, s in enumerate(starts)), starts
    assert starts == sorted(starts)


def test_duration_stops_new_requests_in_both_loops() -> None:
    with FakeServer(FakeConfig(ttft=0.1, itl=0.01)) as fake:
        closed = bench([fake.url], "2", None, output=4, duration=0.5)
        opened = bench([fake.url], None, None, output=4, rate="20", duration=0.5)
    for result in (closed, opened):
        run = result.runs[0]
        assert run.records and all(r.start_s < 0.5 for r in run.records)
        assert not run.summary.capped and run.summary.errors == 0
    assert 4 <= len(closed.runs[0].records) <= 8  # two users, ~0.13 s per request, 0.5 s
    assert len(opened.runs[0].records) == sum(t < 0.5 for t in poisson_arrivals(20.0, 100, arrival_rng(7, 0)))


def test_compare_runs_each_level_on_every_server_in_turn() -> None:
    with FakeServer(FakeConfig(ttft=0.02, itl=0.005)) as a, FakeServer(FakeConfig(ttft=0.02, itl=0.005)) as b:
        result = bench([a.url, b.url], "1,2", 2, output=4)
        times_a = [r.at for r in a.measured()]
        times_b = [r.at for r in b.measured()]
    a1, a2, b1, b2 = times_a[:2], times_a[2:], times_b[:2], times_b[2:]
    assert max(a1) < min(b1) and max(b1) < min(a2) and max(a2) < min(b2)  # A B A B
    order = [(r.summary.url, r.summary.level) for r in result.runs]
    assert order == [(a.url, 1), (b.url, 1), (a.url, 2), (b.url, 2)]
    # the same prompts for both servers at a level: a fair comparison
    texts_a = sorted(r.body["messages"][-1]["content"] for r in a.measured())
    texts_b = sorted(r.body["messages"][-1]["content"] for r in b.measured())
    assert texts_a == texts_b
