"""Real llama.cpp with a KV stream per slot (the default): a request moved between streams.

When a request ends below a running one, the gap between busy seq ids would cost every step an
extra pass over the weights, so after a few steps the scheduler moves the higher request down
(its stream is copied with llama_memory_seq_cp). Its tokens must be exactly those it makes alone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from outpost.engine.config import EngineConfig
from outpost.messages import GenerateRequest, SamplingParams, TokenEvent
from outpost.scheduler.scheduler import COMPACT_AFTER_STEPS
from outpost.serving.assembly import Engine

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def _engine(model: Path) -> Engine:
    # f32 KV and no flash attention: the same tokens in another stream give the very same logits.
    config = EngineConfig(
        model_path=str(model),
        n_ctx=4 * 512,
        n_seq_max=4,
        n_batch=64,
        n_threads=1,
        kv_cache_type="f32",
        flash_attn="off",
    )
    return Engine(config, prefix_cache=False)


async def _tokens(engine: Engine, req: GenerateRequest) -> tuple[list[int], TokenEvent]:
    tokens: list[int] = []
    last: TokenEvent | None = None
    async for event in engine.client.open(req):
        tokens += event.token_ids
        last = event
    assert last is not None and last.finished
    return tokens, last


def test_a_request_moved_into_a_gap_makes_the_tokens_it_makes_alone(tiny_model: Path) -> None:
    with _engine(tiny_model) as eng:
        assert not eng.model.kv_unified, "auto gives a KV stream per slot"
        prompts = [
            eng.tokenize_prompt(eng.render_chat([{"role": "user", "content": f"Story number {i}, please."}]))
            for i in range(3)
        ]
        alone, _ = asyncio.run(_tokens(eng, GenerateRequest(prompts[2], 64, GREEDY)))

        async def together() -> list[tuple[list[int], TokenEvent]]:
            # Submitted in order before the engine's next step: slots 0, 1, 2. The middle one ends
            # first and leaves a gap; the top one is then moved down into it.
            lengths = (64, COMPACT_AFTER_STEPS, 64)
            runs = [
                _tokens(eng, GenerateRequest(p, n, GREEDY)) for p, n in zip(prompts, lengths, strict=True)
            ]
            return await asyncio.wait_for(asyncio.gather(*runs), 120)

        moves = eng.core.scheduler.slot_moves
        results = asyncio.run(together())
        assert eng.core.scheduler.slot_moves == moves + 1, "the top request moved into the gap"
        assert results[2][0] == alone
        assert [len(r[0]) for r in results] == [64, COMPACT_AFTER_STEPS, 64]
