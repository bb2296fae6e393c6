"""Real llama.cpp under KV pressure and cross-slot prefix copies, through the scheduler.

Preemption is forced with a small cache (four slots share 256 cells, four requests want ~480):
the youngest request is preempted, recomputed and resumed. It must resume with the sampler chain
it had: a JSON-schema grammar in the middle of its document, a seeded RNG where it stopped.
Prefix cache off in the pressure engine, so `prompt_n - 2 * len(prompt)` counts the tokens a
preempted request had generated before it was preempted (its recompute evaluates them again).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from outpost.engine.config import EngineConfig
from outpost.engine.grammar import json_schema_to_grammar
from outpost.messages import FinishReason, GenerateRequest, SamplingParams, TokenEvent
from outpost.serving.assembly import Engine

# Enums and booleans only: a random-weight model cannot wander off into an endless string, so the
# document ends (the grammar then allows only end-of-generation) within the token budget.
FIELDS = 6
SCHEMA = {
    "type": "object",
    "properties": {f"c{i}": {"enum": ["red", "green", "blue"]} for i in range(FIELDS)}
    | {f"b{i}": {"type": "boolean"} for i in range(FIELDS)},
    "required": [f"c{i}" for i in range(FIELDS)] + [f"b{i}" for i in range(FIELDS)],
    "additionalProperties": False,
}
# The most tokens the schema's document can take, its end included, whatever the model picks: the
# longest values written compactly, plus at most 4 optional spaces per field and 2 around the braces
# (the grammar's `space ::= " "?`), a byte a token at worst, then the end. The tiny model's greedy
# choices between a space and none are near-ties that other kernels' rounding can flip: 16 fields under
# long keys took 186 of 200 tokens on one Zen 3, and more spaces elsewhere would have run to the limit.
DOC_TOKENS = (
    len(
        json.dumps(
            {k: "green" if k[0] == "c" else False for k in SCHEMA["properties"]}, separators=(",", ":")
        )
    )
    + 4 * 2 * FIELDS
    + 2
    + 1
)
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


def _config(model: Path, n_ctx: int, kv_unified: str = "on") -> EngineConfig:
    # f32 KV and no flash attention: a recompute gives the very same logits as the first pass.
    # One pool by default: pressure needs requests that may use all the cells.
    return EngineConfig(
        model_path=str(model),
        n_ctx=n_ctx,
        n_seq_max=4,
        n_batch=64,
        n_threads=1,  # a shared CPU: no OpenMP barrier waiting on a descheduled second thread
        kv_cache_type="f32",
        flash_attn="off",
        kv_unified=kv_unified,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def tight(tiny_model: Path):
    with Engine(_config(tiny_model, 256), max_queue=8, prefix_cache=False) as eng:
        yield eng


def _prompt(engine: Engine, text: str) -> list[int]:
    return engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": text}]))


async def _collect(engine: Engine, req: GenerateRequest) -> tuple[list[int], str, TokenEvent]:
    tokens: list[int] = []
    text: list[str] = []
    last: TokenEvent | None = None
    async for event in engine.client.open(req):
        tokens += event.token_ids
        text.append(event.text)
        last = event
    assert last is not None and last.finished
    return tokens, "".join(text), last


def _under_pressure(engine: Engine, target: GenerateRequest) -> tuple[list[int], str, TokenEvent]:
    """Runs `target` as the youngest of four requests that overfill the cache; returns its result."""

    async def main() -> tuple[list[int], str, TokenEvent]:
        others = [
            GenerateRequest(_prompt(engine, f"Busy request {i} about rivers"), 110, GREEDY) for i in range(3)
        ]
        runs = [asyncio.ensure_future(_collect(engine, r)) for r in others]
        await asyncio.sleep(0)  # the others are submitted first: the target is the youngest
        results = await asyncio.wait_for(asyncio.gather(*runs, _collect(engine, target)), 300)
        for tokens, _, last in results[:3]:
            assert (len(tokens), last.finish_reason) == (110, FinishReason.LENGTH)
        return results[3]

    return asyncio.run(main())


def _generated_before_preemption(engine: Engine, req: GenerateRequest, last: TokenEvent) -> int:
    """Tokens generated before a preemption (prefix cache off: every admission evaluates all)."""
    assert last.timings is not None and last.timings.cache_n == 0
    n = len(req.prompt_tokens)
    assert last.timings.prompt_n > n, "the request was never preempted: the test forces nothing"
    return last.timings.prompt_n - 2 * n


def test_a_json_schema_answer_stays_valid_across_a_preemption(tight: Engine) -> None:
    sampling = SamplingParams(temperature=0.0, grammar=json_schema_to_grammar(SCHEMA))
    req = GenerateRequest(_prompt(tight, "Describe the weather as JSON."), DOC_TOKENS, sampling)
    _, text, last = _under_pressure(tight, req)
    assert _generated_before_preemption(tight, req, last) > 0, "preempted mid-document"
    assert last.finish_reason is FinishReason.STOP, (last.finish_reason, text)
    document = json.loads(text)
    assert set(document) == set(SCHEMA["required"])  # type: ignore[arg-type]
    assert all(document[f"c{i}"] in ("red", "green", "blue") for i in range(FIELDS))
    assert all(isinstance(document[f"b{i}"], bool) for i in range(FIELDS))


def test_a_seeded_answer_is_the_same_with_and_without_a_preemption(tight: Engine) -> None:
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=4321, ignore_eos=True)
    prompt = _prompt(tight, "Tell me a story about a lighthouse.")
    alone, _, alone_last = asyncio.run(_collect(tight, GenerateRequest(prompt, 120, sampling)))
    assert alone_last.timings is not None and alone_last.timings.prompt_n == len(prompt), "not preempted"
    req = GenerateRequest(prompt, 120, sampling)
    pressed, _, last = _under_pressure(tight, req)
    assert _generated_before_preemption(tight, req, last) > 0
    assert pressed == alone
    other_seed = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1, ignore_eos=True)
    different, _, _ = asyncio.run(_collect(tight, GenerateRequest(prompt, 120, other_seed)))
    assert different != alone, "the seed matters, so equal texts mean the RNG state was kept"


@pytest.mark.parametrize("kv_unified", ["on", "off"])
def test_a_prefix_copied_from_a_busy_slot_gives_the_same_tokens(tiny_model: Path, kv_unified: str) -> None:
    """Request B shares A's long prefix and arrives while A is still decoding: the scheduler copies
    A's cells into B's slot (llama_memory_seq_cp: tagged cells in one pool, a copied stream with a
    stream per slot) and B evaluates only its own tail. Every token of both must equal a run with
    the prefix cache off."""
    system = "You are a meticulous archivist of lanterns and maps. " * 10
    texts = ("Catalogue the copper lantern.", "Describe the orchard at dusk.")

    def run(prefix_cache: bool) -> tuple[list[list[int]], list[TokenEvent], int]:
        with Engine(_config(tiny_model, 4096, kv_unified), prefix_cache=prefix_cache) as eng:
            assert eng.model.kv_unified == (kv_unified == "on")
            # Held at >= 20 ms a step: A's 48 tokens last >= 0.96 s, so B, sent at A's first
            # token, is admitted while A still decodes (a copy, not A's finished slot reused).
            eng.core.step_delay = 0.02
            prompts = [
                eng.tokenize_prompt(
                    eng.render_chat([{"role": "system", "content": system}, {"role": "user", "content": t}])
                )
                for t in texts
            ]
            first_token = threading.Event()
            results: list[tuple[list[int], str, TokenEvent]] = []

            async def first() -> tuple[list[int], str, TokenEvent]:
                tokens: list[int] = []
                last = None
                async for event in eng.client.open(GenerateRequest(prompts[0], 48, GREEDY)):
                    tokens += event.token_ids
                    first_token.set()
                    last = event
                assert last is not None
                return tokens, "", last

            async def second() -> tuple[list[int], str, TokenEvent]:
                while not first_token.is_set():  # A has its prefix in KV and is decoding now
                    await asyncio.sleep(0.001)
                return await _collect(eng, GenerateRequest(prompts[1], 48, GREEDY))

            async def both() -> None:
                results.extend(await asyncio.wait_for(asyncio.gather(first(), second()), 120))

            asyncio.run(both())
            held = [eng.core.scheduler.cached_tokens(i) for i in range(4)]
            # A and B ended in two different slots, each holding its own prompt and answer.
            for p, (tokens, _, _) in zip(prompts, results, strict=True):
                assert sum(h == (*p, *tokens[:-1]) for h in held) == 1
            shared = _common_prefix(prompts[0], prompts[1])
            return [r[0] for r in results], [r[2] for r in results], shared

    copied, copied_last, shared = run(prefix_cache=True)
    plain, plain_last, _ = run(prefix_cache=False)
    assert shared >= 100
    b = copied_last[1].timings
    assert b is not None and b.cache_n == shared, "B reused A's prefix from A's slot"
    assert plain_last[1].timings is not None and plain_last[1].timings.cache_n == 0
    assert [len(t) for t in copied] == [48, 48]
    assert copied == plain


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
