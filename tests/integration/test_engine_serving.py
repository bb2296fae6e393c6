"""The whole engine (scheduler + engine thread + real llama.cpp) serving many requests on the tiny model."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from outpost.engine.config import EngineConfig
from outpost.messages import FinishReason, GenerateRequest, SamplingParams, TokenEvent
from outpost.serving.assembly import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    eng = Engine(EngineConfig(model_path=str(tiny_model), n_ctx=4096, n_seq_max=4, n_batch=256), max_queue=32)
    yield eng
    eng.close()


def _chat(engine: Engine, text: str, system: str = "You are a helpful assistant") -> list[int]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": text}]
    return engine.tokenize_prompt(engine.render_chat(messages))


def _run(engine: Engine, request: GenerateRequest) -> tuple[list[int], str, TokenEvent]:
    tokens: list[int] = []
    text: list[str] = []
    last = None
    for event in engine.client.generate_sync(request):
        tokens += event.token_ids
        text.append(event.text)
        last = event
    assert last is not None and last.finished
    return tokens, "".join(text), last


def test_generation_is_streamed_and_timed(engine: Engine) -> None:
    tokens, text, last = _run(
        engine, GenerateRequest(_chat(engine, "Hello there"), max_tokens=20, sampling=GREEDY)
    )
    assert len(tokens) == 20 and last.finish_reason is FinishReason.LENGTH
    assert text.strip(), "random weights still render visible text"
    t = last.timings
    assert t is not None and t.predicted_n == 20 and t.prompt_n > 0 and t.prompt_ms > 0 and t.predicted_ms > 0


def test_prefix_cache_reuses_tokens_and_gives_the_same_answer(engine: Engine, tiny_model: Path) -> None:
    system = "You are a meticulous archivist. " * 12
    first = _chat(engine, "Catalogue the copper lantern.", system)
    second = _chat(engine, "Describe the orchard at dusk.", system)
    _run(engine, GenerateRequest(first, max_tokens=4, sampling=GREEDY))
    warm_tokens, _, warm = _run(engine, GenerateRequest(second, max_tokens=12, sampling=GREEDY))
    assert warm.timings is not None
    assert warm.timings.cache_n >= 100, "the shared system prompt came from the cache"
    assert warm.timings.prompt_n == len(second) - warm.timings.cache_n, "only the new tokens were evaluated"
    cold_config = EngineConfig(model_path=str(tiny_model), n_ctx=4096, n_seq_max=4, n_batch=256)
    with Engine(cold_config, prefix_cache=False) as cold_engine:
        cold_tokens, _, cold = _run(cold_engine, GenerateRequest(second, max_tokens=12, sampling=GREEDY))
    assert cold.timings is not None and cold.timings.cache_n == 0 and cold.timings.prompt_n == len(second)
    assert warm_tokens[:4] == cold_tokens[:4]


def test_same_seed_same_output(engine: Engine) -> None:
    prompt = _chat(engine, "Tell me a story about a river.")
    sampling = SamplingParams(temperature=1.0, seed=1234, ignore_eos=True)
    a, _, _ = _run(engine, GenerateRequest(prompt, max_tokens=24, sampling=sampling))
    b, _, _ = _run(engine, GenerateRequest(prompt, max_tokens=24, sampling=sampling))
    c, _, _ = _run(engine, GenerateRequest(prompt, max_tokens=24, sampling=SamplingParams(1.0, seed=99)))
    assert a == b
    assert a != c


def test_sixteen_concurrent_requests_finish_with_the_right_lengths(engine: Engine) -> None:
    async def one(i: int) -> tuple[int, int, FinishReason | None]:
        req = GenerateRequest(_chat(engine, f"Request number {i}: list {i} colours."), max_tokens=8 + i)
        req.sampling = SamplingParams(temperature=0.7, seed=i, ignore_eos=True)
        n = 0
        reason = None
        async for event in engine.client.open(req):
            n += len(event.token_ids)
            reason = event.finish_reason
        return i, n, reason

    async def all_of_them() -> list[tuple[int, int, FinishReason | None]]:
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(16))), timeout=120)

    for i, n, reason in asyncio.run(all_of_them()):
        assert (n, reason) == (8 + i, FinishReason.LENGTH)


def test_abort_frees_the_slot(engine: Engine) -> None:
    long_request = GenerateRequest(_chat(engine, "Write forever."), max_tokens=2000, sampling=GREEDY)
    engine.core.step_delay = 0.005  # held: 2,000 tokens take >= 10 s, so it is busy when we look
    try:
        stream = engine.client.generate_sync(long_request)
        next(stream)
        assert engine.core.scheduler.slots_busy == 1
        stream.close()  # the caller goes away
    finally:
        engine.core.step_delay = 0.0
    deadline = time.monotonic() + 10
    while engine.core.scheduler.slots_busy and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.core.scheduler.slots_busy == 0
    tokens, _, last = _run(
        engine, GenerateRequest(_chat(engine, "Still there?"), max_tokens=5, sampling=GREEDY)
    )
    assert len(tokens) == 5 and last.finish_reason is FinishReason.LENGTH


def test_quantized_model_serves_batches(tiny_model: Path, tmp_path: Path) -> None:
    """q8_0 weights through multi-token prefill and parallel decode (where AMX tiles fault, the auto
    layout must keep every micro-batch to one token: see outpost/engine/cpu_probe.py)."""
    from outpost.models import write_synthetic_model

    q8 = write_synthetic_model("tiny", tmp_path / "tiny-q8_0.gguf", quant="q8_0")
    with Engine(EngineConfig(model_path=str(q8), n_ctx=2048, n_seq_max=4, n_batch=256)) as eng:

        async def all_four() -> list[int]:
            async def one(i: int) -> int:
                req = GenerateRequest(_chat(eng, f"Quantized request {i} about rivers"), max_tokens=12)
                req.sampling = SamplingParams(temperature=0.5, seed=i, ignore_eos=True)
                return sum([len(e.token_ids) async for e in eng.client.open(req)])

            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(4))), timeout=60)

        assert asyncio.run(all_four()) == [12, 12, 12, 12]


def test_a_stream_per_slot_serves_batches_and_copies_prefixes_across_slots(tiny_model: Path) -> None:
    """-kvu off: each slot its own KV stream; a prefix held by another slot is copied (the runner
    copies the stream and trims it), and busy slots decode together, in seq id order."""
    config = EngineConfig(model_path=str(tiny_model), n_ctx=4096, n_seq_max=4, n_batch=256, kv_unified="off")
    with Engine(config, max_queue=32) as engine:
        assert not engine.model.kv_unified and engine.n_ctx_seq == 1024
        system = "You are a meticulous archivist. " * 12
        first = _chat(engine, "Catalogue the copper lantern.", system)
        second = _chat(engine, "Describe the orchard at dusk.", system)
        _run(engine, GenerateRequest(first, max_tokens=4, sampling=GREEDY))
        warm_tokens, _, warm = _run(engine, GenerateRequest(second, max_tokens=12, sampling=GREEDY))
        assert warm.timings is not None and warm.timings.cache_n >= 100

        async def one(i: int) -> int:
            req = GenerateRequest(_chat(engine, f"Story {i}"), max_tokens=8 + i, sampling=GREEDY)
            return sum([len(event.token_ids) async for event in engine.client.open(req)])

        async def all_of_them() -> list[int]:
            return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(8))), timeout=120)

        assert asyncio.run(all_of_them()) == [8 + i for i in range(8)]
    cold_config = EngineConfig(model_path=str(tiny_model), n_ctx=4096, n_seq_max=4, n_batch=256)
    with Engine(cold_config, prefix_cache=False) as cold_engine:
        cold_tokens, _, _ = _run(cold_engine, GenerateRequest(second, max_tokens=12, sampling=GREEDY))
    assert warm_tokens[:4] == cold_tokens[:4]
