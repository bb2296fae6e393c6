"""Load shapes: closed loop keeps exactly N requests in flight, open loop fires on its Poisson
schedule whatever is in flight, --duration stops new requests, --ramp-up starts closed-loop users
one by one, --compare alternates servers."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics

from bench_fake_server import FakeConfig, FakeServer, bench
from virtual_time import run_virtual

from outpost.bench.loadgen import Phase, arrival_rng, poisson_arrivals, run_phase
from outpost.bench.prompts import Prompt
from outpost.bench.records import RequestRecord


class TimedSends:
    """A send function in virtual time: each request takes `service_s` and is logged as it starts."""

    def __init__(self, service_s: float) -> None:
        self.service_s = service_s
        self.starts: list[float] = []
        self.in_flight = 0
        self.most = 0

    async def __call__(self, prompt: Prompt, now: float) -> RequestRecord:
        self.starts.append(now)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(self.service_s)
        self.in_flight -= 1
        return RequestRecord(prompt.index, now, 1, 1)


def _ignore(record: RequestRecord) -> None:
    pass


def _phase(mode: str, level: float, count: int, duration: float | None = None) -> Phase:
    prompts = [Prompt(i, None, "hi", 1, 1) for i in range(count)]
    return Phase(mode, level, prompts, duration)  # type: ignore[arg-type]


def test_poisson_arrivals_have_exponential_gaps_and_are_seeded() -> None:
    times = poisson_arrivals(4.0, 4000, random.Random(1))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert times[0] == 0.0 and all(g >= 0 for g in gaps)
    assert abs(statistics.mean(gaps) - 0.25) < 0.25 * 0.06
    assert abs(statistics.stdev(gaps) / statistics.mean(gaps) - 1.0) < 0.1  # exponential: CV 1
    assert poisson_arrivals(4.0, 50, random.Random(1)) == times[:50]
    assert poisson_arrivals(4.0, 50, random.Random(2)) != times[:50]


def test_open_loop_fires_on_its_exact_schedule_in_virtual_time() -> None:
    sends = TimedSends(0.42)
    outcome = run_virtual(run_phase(_phase("rate", 15.0, 12), sends, arrival_rng(7, 0), _ignore))
    planned = poisson_arrivals(15.0, 12, arrival_rng(7, 0))
    assert max(abs(s - p) for s, p in zip(sends.starts, planned, strict=True)) < 1e-9, sends.starts
    assert len(outcome.records) == 12 and sends.most >= 3  # replies never held an arrival back


def test_open_loop_fires_without_waiting_for_replies() -> None:
    with FakeServer(FakeConfig(ttft=0.4, itl=0.01)) as fake:
        result = bench([fake.url], None, 12, output=3, rate="15")
        most = fake.max_in_flight
    # replies take >= 0.42 s and arrivals come every ~67 ms: a closed loop could never overlap them
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


def test_duration_stops_new_requests_in_virtual_time() -> None:
    closed = TimedSends(0.13)  # two users: each starts at 0, 0.13, 0.26, 0.39; 0.52 is past 0.5
    outcome = run_virtual(run_phase(_phase("concurrency", 2, 100, 0.5), closed, arrival_rng(7, 0), _ignore))
    expected = sorted(2 * [0.0, 0.13, 0.26, 0.39])
    assert max(abs(a - b) for a, b in zip(sorted(closed.starts), expected, strict=True)) < 1e-9, closed.starts
    assert len(outcome.records) == 8 and not outcome.capped
    opened = TimedSends(0.13)
    outcome = run_virtual(run_phase(_phase("rate", 20.0, 100, 0.5), opened, arrival_rng(7, 0), _ignore))
    planned = [t for t in poisson_arrivals(20.0, 100, arrival_rng(7, 0)) if t < 0.5]
    assert len(outcome.records) == len(planned) and not outcome.capped


def test_duration_stops_new_requests_in_both_loops() -> None:
    with FakeServer(FakeConfig(ttft=0.1, itl=0.01)) as fake:
        closed = bench([fake.url], "2", None, output=4, duration=0.5)
        opened = bench([fake.url], None, None, output=4, rate="20", duration=0.5)
    # The closed loop checks the clock before each send and records that time; the open loop sends
    # what was planned before 0.5 s, and records when it was sent: a late wake-up on a loaded core
    # may put that a little past 0.5 (the planned count below is exact).
    for result, slack in ((closed, 0.0), (opened, 0.1)):
        run = result.runs[0]
        assert run.records and all(r.start_s < 0.5 + slack for r in run.records), run.records
        assert not run.summary.capped and run.summary.errors == 0
    # two users, each request >= 0.14 s (the fake's sleeps): at most 4 each in 0.5 s on any machine
    assert 2 <= len(closed.runs[0].records) <= 8
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
