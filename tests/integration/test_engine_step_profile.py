"""OUTPOST_STEP_PROFILE on real llama.cpp: the profile's llama_decode column is the call's own time,
and each step's width is the sequences the engine decoded together (benchmarks/serve/steps.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from benchmarks.serve.steps import read_profile
from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams
from outpost.serving.assembly import Engine
from outpost.serving.step_profile import PROFILE_ENV


def test_three_streams_decode_in_steps_of_three_and_the_decode_call_is_timed(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv(PROFILE_ENV, str(path))
    config = EngineConfig(model_path=str(tiny_model), n_ctx=3 * 256, n_seq_max=3, n_batch=64, n_threads=1)
    greedy = SamplingParams(temperature=0.0, ignore_eos=True)
    with Engine(config, prefix_cache=False) as eng:
        prompts = [eng.tokenize_prompt(f"Story number {i}, please.") for i in range(3)]

        async def run(prompt: list[int]) -> int:
            return sum([len(e.token_ids) async for e in eng.client.open(GenerateRequest(prompt, 12, greedy))])

        async def together() -> list[int]:
            return list(await asyncio.gather(*(run(p) for p in prompts)))

        assert asyncio.run(together()) == [12, 12, 12]
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    steps = [s for s in steps if "decode" in s]
    assert sum(s["decode"] for s in steps) == 3 * 11  # the first token of each comes from its prompt
    assert sum(s["prompt"] for s in steps) == sum(len(p) for p in prompts)
    assert all(s["llama_decode"] > 0 for s in steps), "every step that decodes calls llama_decode"
    # Submitted before a step began or not, all three decode together once their prompts are read.
    profile = read_profile(path.read_text().splitlines(), widths={3})
    assert len(profile.groups[(3, False)].totals) >= 8
