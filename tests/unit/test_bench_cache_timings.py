"""`outpost bench` keeps what llama-server and Outpost say about their prompt cache (`timings.prompt_n`,
`timings.cache_n`) per request, in the records and requests.csv; and its steps run a level on a
server described rather than probed, which then gets no request before the measured ones."""

from __future__ import annotations

import asyncio
import csv
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
from bench_fake_server import FakeConfig, FakeServer, bench

from outpost.bench.config import BenchConfig, make_plan, make_scenario, make_targets
from outpost.bench.progress import Progress
from outpost.bench.prompts import build_prompts
from outpost.bench.records import Accepted, RunResult
from outpost.bench.runner import connect, prompt_builder, run_level
from outpost.cli import main

PLANTED = {"prompt_n": 3, "prompt_ms": 1.5, "predicted_n": 4, "cache_n": 9}


def test_timings_prompt_n_and_cache_n_are_recorded() -> None:
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002, timings=PLANTED)) as fake:
        result = bench([fake.url], "2", 4, output=4)
    records = result.runs[0].records
    assert [(r.prompt_n, r.cache_n) for r in records] == [(3, 9)] * 4
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002)) as fake:  # a server without timings
        result = bench([fake.url], "1", 2, output=4)
    assert [(r.prompt_n, r.cache_n) for r in result.runs[0].records] == [(None, None)] * 2


def test_requests_csv_has_prompt_n_and_cache_n(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002, timings={"prompt_n": 7, "cache_n": 0})) as fake:
        args = ["bench", "--url", fake.url, "--input-tokens", "10", "--output-tokens", "4"]
        rc = main([*args, "--concurrency", "1", "--requests", "2", "--out", str(tmp_path), "--no-plots"])
    assert rc == 0, capsys.readouterr().err
    rows = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert [(r["prompt_n"], r["cache_n"]) for r in rows] == [("7", "0")] * 2


async def _cold_level(url: str) -> tuple[RunResult, int]:
    config = BenchConfig(
        targets=make_targets(url, [], None),
        plan=make_plan("2", None, 4, None, 0),
        scenario=make_scenario("shared-prefix", "6", "4"),
        seed=1,
        timeout=30.0,
    )
    async with AsyncExitStack() as stack:
        server = await connect(config.targets[0], config, stack, Accepted(True, True, True))
        builder, _ = await prompt_builder(server, config)
        prompts = await build_prompts(builder, config.scenario, "s", 4)
        return await run_level(server, config, 0, 2, prompts, [], Progress()), len(prompts)


def test_a_described_server_gets_no_probe_before_the_measured_requests() -> None:
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002)) as fake:
        run, count = asyncio.run(_cold_level(fake.url))
        bodies = [r.body for r in fake.received]
    assert len(bodies) == count == 4 and run.summary.requests_ok == 4  # no "Hello" probe first
    system = {b["messages"][0]["content"] for b in bodies}
    assert len(system) == 1 and len(next(iter(system)).split()) == 500  # one shared 500-token prefix
    assert all(b["ignore_eos"] and b["stream_options"] == {"include_usage": True} for b in bodies)
