"""Prompts: exact token counts through the server's /tokenize (either known shape), a stated
estimate without it, distinct and seeded, a shared prefix only where the scenario wants one."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from pathlib import Path

import pytest
from bench_fake_server import FakeConfig, FakeServer, bench

from outpost.bench.config import make_scenario
from outpost.bench.prompts import COMMON_WORDS, PromptBuilder, build_prompts
from outpost.bench.tokens import EstimateCounter, single_token_words

FAST = FakeConfig(ttft=0.005, itl=0.001)


def user_texts(fake: FakeServer) -> list[str]:
    return [r.body["messages"][-1]["content"] for r in fake.measured()]


@pytest.mark.parametrize("shape", ["llama.cpp", "vllm"])
def test_prompts_hit_the_asked_token_counts_exactly_with_tokenize(shape: str) -> None:
    with FakeServer(FakeConfig(ttft=0.005, itl=0.001, tokenize=shape)) as fake:
        result = bench([fake.url], "4", 16, output=4, input_tokens="40,15")
        texts = user_texts(fake)
    assert result.prompts.exact and result.prompts.method == "tokenize"
    records = result.runs[0].records
    lengths = sorted(len(t.split()) for t in texts)  # the fake tokenizer: one token per word
    assert lengths == sorted(r.input_tokens for r in records)
    assert len(set(lengths)) > 3  # a normal(40, 15) spread, not one length
    assert len(set(texts)) == len(texts)  # distinct: no free prefix-cache hits
    assert len({t.split()[0] + t.split()[1] for t in texts}) == len(texts)  # distinct from the start


def test_without_tokenize_lengths_are_a_stated_estimate() -> None:
    with FakeServer(FakeConfig(ttft=0.005, itl=0.001, tokenize=None)) as fake:
        result = bench([fake.url], "2", 4, output=4, input_tokens="30")
        texts = user_texts(fake)
    assert not result.prompts.exact and result.prompts.method == "estimate"
    assert "ESTIMATE" in result.prompts.note
    assert all(len(t.split()) == 30 for t in texts)  # common words: one (estimated) token each


def test_same_seed_same_prompts_new_seed_new_prompts() -> None:
    with FakeServer(FAST) as fake:
        bench([fake.url], "1", 3, output=2, seed=1)
        bench([fake.url], "1", 3, output=2, seed=1)
        bench([fake.url], "1", 3, output=2, seed=2)
        texts = user_texts(fake)
    assert texts[0:3] == texts[3:6]
    assert not set(texts[0:3]) & set(texts[6:9])


def test_shared_prefix_is_shared_within_a_level_only() -> None:
    with FakeServer(FAST) as fake:
        result = bench([fake.url], "2,3", 4, output=0, scenario="shared-prefix", input_tokens=None)
        messages = [r.body["messages"] for r in fake.measured()]
    systems = [m[0]["content"] for m in messages]
    assert all(m[0]["role"] == "system" and len(m) == 2 for m in messages)
    assert len(set(systems[:4])) == 1 and len(set(systems[4:])) == 1 and systems[0] != systems[4]
    assert len(systems[0].split()) == 500  # the preset's ~500-token system prompt, exact here
    users = [len(m[1]["content"].split()) for m in messages]
    assert all(20 <= n <= 60 for n in users) and len({m[1]["content"] for m in messages}) == 8
    assert sorted(r.input_tokens for r in result.runs[0].records) == sorted(500 + n for n in users[:4])


def test_summarize_and_completions_endpoint() -> None:
    with FakeServer(FAST) as fake:
        bench([fake.url], "1", 2, output=4, scenario="summarize", input_tokens=None, endpoint="completions")
        bodies = [r.body for r in fake.measured()]
    assert all("messages" not in b for b in bodies)
    assert all(b["prompt"].startswith("Summarize the following text:") for b in bodies)
    assert all(len(b["prompt"].split()) == 1000 for b in bodies)


def test_fit_uses_a_prompt_file_and_tops_up_to_the_exact_count(tmp_path: Path) -> None:
    class WordsPlusLongOnes:  # a tokenizer where long words cost two tokens
        exact, method = True, "tokenize"

        async def count(self, text: str) -> int:
            return sum(2 if len(w) > 6 else 1 for w in text.split())

    corpus = ("the quick brown foxes jumped extraordinarily over lazy sleeping dogs " * 30).split()
    builder = PromptBuilder(WordsPlusLongOnes(), ["cat", "dog"], corpus)
    scenario = make_scenario("custom", "37,9", "8")
    prompts = asyncio.run(build_prompts(builder, scenario, "s", 20))
    counter = WordsPlusLongOnes()
    for p in prompts:
        assert asyncio.run(counter.count(p.text)) == p.input_tokens
    assert len({p.text for p in prompts}) > 15  # random offsets into the file


def test_single_token_words_bisects_out_multi_token_words() -> None:
    class TwoTokenQ:
        exact, method = True, "tokenize"
        calls = 0

        async def count(self, text: str) -> int:
            TwoTokenQ.calls += 1
            return sum(2 if "q" in w else 1 for w in text.split())

    words = list(COMMON_WORDS)
    kept = asyncio.run(single_token_words(TwoTokenQ(), words))
    assert kept == [w for w in words if "q" not in w] and len(kept) < len(words)
    assert TwoTokenQ.calls < 40


def test_estimate_counter_counts_common_words_as_one() -> None:
    counter = EstimateCounter(frozenset(COMMON_WORDS))
    assert asyncio.run(counter.count("river stone lantern")) == 3
    assert asyncio.run(counter.count("antidisestablishment")) == 5  # 20 characters / 4
    rng = random.Random(0)
    assert len({rng.choice(COMMON_WORDS) for _ in range(500)}) > 100


def test_bench_package_never_imports_the_engine() -> None:
    code = (
        "import sys, outpost.bench.runner, outpost.bench.cli_args, outpost.bench.report\n"
        "import outpost.bench.plots\n"
        "bad = [m for m in sys.modules if m.split('.')[0] == 'llama_cpp' or m in "
        "('outpost.engine', 'outpost.serving', 'outpost.run', 'outpost.scheduler')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
