"""OUTPOST_STEP_PROFILE: an engine core writes one record per decoding step (its width and where
its time went) and its threads' CPU seconds; benchmarks/serve/steps.py sums them up. Driven with
the fake runner, so the widths are exact and no assertion depends on how long anything took."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fake_runner import FakeRunner

from benchmarks.serve.steps import PARTS, read_profile, table
from outpost.messages import GenerateRequest
from outpost.scheduler import Scheduler, SchedulerConfig
from outpost.scheduler.output import BatchChunk, RunnerOutput, SchedulerOutput
from outpost.serving.engine_core import EngineClient, EngineCore
from outpost.serving.step_profile import PROFILE_ENV, seq_id_runs

CLAIMED_DECODE_S = 0.0025  # what the fake says each llama_decode took


class Runner(FakeRunner):
    def warmup(self) -> None:
        pass

    def close(self) -> None:
        pass

    def execute(self, out: SchedulerOutput) -> RunnerOutput:
        result = super().execute(out)
        result.decode_s = CLAIMED_DECODE_S
        return result


def _generate_two(path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Two requests in two slots: prompts of 3 and 2 tokens, 4 tokens each; the engine's tid."""
    monkeypatch.setenv(PROFILE_ENV, str(path))
    config = SchedulerConfig(n_slots=2, n_ctx=256, n_ctx_seq=128, max_queue=2, step_token_budget=64)
    core = EngineCore(Scheduler(config), Runner())
    try:
        client = EngineClient(core)
        results: list[int] = []
        threads = [
            threading.Thread(
                target=lambda p=p: results.append(
                    sum(len(e.token_ids) for e in client.generate_sync(GenerateRequest(p, max_tokens=4)))
                )
            )
            for p in ([3, 4, 5], [6, 7])
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert sorted(results) == [4, 4]
        assert core._thread.native_id is not None
        return core._thread.native_id
    finally:
        core.stop()


def test_each_decoding_step_is_a_record_of_its_width_and_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "steps.jsonl"
    engine_tid = _generate_two(path, monkeypatch)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert records[0]["engine_tid"] == engine_tid
    steps = [r for r in records if "decode" in r]
    # Every token a request got came from a step: a prompt's last chunk samples the first one.
    assert sum(s["decode"] for s in steps) == 2 * 3
    assert sum(s["prompt"] for s in steps) == 3 + 2
    assert all(s["llama_decode"] == CLAIMED_DECODE_S * 1e3 for s in steps)
    assert all(s["runs"] == 1 for s in steps)  # seq ids 0 and 1, or one of them
    assert all(set(PARTS) <= s.keys() and s["schedule"] >= 0 and s["emit"] >= 0 for s in steps)
    cpu = [r["cpu"] for r in records if "cpu" in r]
    assert len(cpu) >= 2, "one record at the first step, one when the core stops"
    assert set(cpu[-1]) == {"engine", "main", "other"} and cpu[-1]["engine"] >= cpu[0]["engine"]


def test_no_file_is_written_unless_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PROFILE_ENV, raising=False)
    config = SchedulerConfig(n_slots=1, n_ctx=64, n_ctx_seq=64, max_queue=1, step_token_budget=16)
    core = EngineCore(Scheduler(config), Runner())
    try:
        assert core._profile is None
    finally:
        core.stop()


def test_the_summary_groups_steps_by_width_and_its_parts_add_up_to_the_step() -> None:
    def step(decode: int, prompt: int, ms: float, runs: int | None = None) -> str:
        parts = dict.fromkeys(PARTS, ms)
        extra = {} if runs is None else {"runs": runs}
        return json.dumps({"t": 0, "decode": decode, "prompt": prompt, **parts, **extra})

    lines = [
        json.dumps({"start": 0, "pid": 7, "engine_tid": 8}),
        json.dumps({"t": 10.0, "cpu": {"engine": 1.0, "main": 2.0, "other": 3.0}}),
        step(16, 0, 1.0),
        step(16, 0, 3.0, runs=2),
        step(16, 120, 10.0),
        step(4, 0, 0.5),
        json.dumps({"t": 0, "decode": 16, "prompt": 0, **dict.fromkeys(PARTS, 1.0), "wait": 5000.0}),
        json.dumps({"t": 20.0, "cpu": {"engine": 3.0, "main": 6.0, "other": 11.0}}),
    ]
    profile = read_profile(lines)
    assert {k: len(g.totals) for k, g in profile.groups.items()} == {
        (16, False): 2,
        (16, True): 1,
        (4, False): 1,
    }
    assert profile.groups[(16, False)].totals == [6.0, 18.0]  # six parts each; the idle wait left out
    assert profile.cpu == {"engine": 2.0, "main": 4.0, "other": 8.0} and profile.wall_s == 10.0
    rows = table(profile).splitlines()
    assert rows[2].startswith("| 4 | 0 | 1 | 1.00 |") and rows[-1].startswith(
        "| 16 | 120 (mean) | 1 | 1.00 | 10.00"
    )
    assert rows[3].startswith("| 16 | 0 | 2 | 1.50 |")  # a profile without runs counts one
    assert read_profile(lines, widths={4}).groups.keys() == {(4, False)}


@pytest.mark.parametrize(
    ("seq_ids", "runs"), [((), 0), ((3,), 1), ((0, 1, 2, 3), 1), ((0, 2, 3, 4), 2), ((5, 0, 15, 1), 3)]
)
def test_a_steps_runs_are_its_stretches_of_consecutive_seq_ids(seq_ids: tuple[int, ...], runs: int) -> None:
    """With a KV stream per slot llama.cpp decodes each such stretch as its own micro-batch; a
    sequence with several chunks (a draft, a prompt) counts once."""
    chunks = [BatchChunk(seq, [1], 0, True) for seq in seq_ids] + [
        BatchChunk(s, [2], 1, True) for s in seq_ids[:1]
    ]
    assert seq_id_runs(SchedulerOutput(chunks=chunks)) == runs
