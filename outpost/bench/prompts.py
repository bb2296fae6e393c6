"""Prompts of exact token lengths, distinct across requests and runs.

Text is random common words (seeded), or windows of a `--prompt-file` starting at seeded random
offsets. `fit` measures a draft with the `TokenCounter`, trims it below the target, then tops it up
with words known to add exactly one token each, so the result hits the target exactly when the
counter is the server's `/tokenize` (and by estimate otherwise). Every prompt starts differently, so
no server gets a free prefix-cache hit, except for a scenario's shared prefix, which is on purpose.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from outpost.bench.config import Scenario
from outpost.bench.tokens import TokenCounter

COMMON_WORDS = tuple(
    dict.fromkeys(
        """time year people way day man thing woman life child world school state family student group
    country problem hand part place case week company system program question work government number
    night point home water room mother area money story fact month lot right study book eye job word
    business issue side kind head house service friend father power hour game line end member law car
    city community name president team minute idea kid body information back parent face others level
    office door health person art war history party result change morning reason research girl guy
    moment air teacher force education river stone lantern orchard copper meadow harbor signal winter
    garden pilot ledger canyon thunder violet engine marble forest quiet rapid silver market bridge
    candle desert falcon green small large good new old great high little long young important few
    public bad same able open early late hard clear full simple strong true red blue white black
    light dark warm cold fast slow happy free real best sure low deep past wide whole main early
    make take give find tell ask feel leave call keep bring begin show hear play run move live believe
    hold write stand lose pay meet include continue set learn lead understand watch follow stop create
    speak read spend grow walk win offer remember love consider appear buy wait serve die send build
    stay fall cut reach kill raise pass sell decide return explain hope develop carry break receive""".split()
    )
)
MAX_ROUNDS = 8  # tokenize calls per prompt, whatever the tokenizer does


@dataclass(frozen=True)
class Prompt:
    """One request's input: `system` is the level's shared prefix (None without one)."""

    index: int
    system: str | None
    text: str
    input_tokens: int  # tokens of system + text, as the counter counts them
    max_tokens: int


@dataclass(frozen=True)
class Fitted:
    text: str
    tokens: int


class PromptBuilder:
    """Builds prompts for one scenario from seeded random generators."""

    def __init__(self, counter: TokenCounter, fill_words: list[str], corpus: list[str] | None) -> None:
        if not fill_words:
            raise ValueError("no single-token words to build prompts from")
        self.counter = counter
        self.fill = fill_words
        self.corpus = corpus

    def _draft(self, rng: random.Random, n: int) -> list[str]:
        if self.corpus:
            start = rng.randrange(len(self.corpus))
            return [self.corpus[(start + i) % len(self.corpus)] for i in range(n)]
        return [rng.choice(self.fill) for _ in range(n)]

    async def fit(self, rng: random.Random, target: int, lead: str = "") -> Fitted:
        """`lead` + text of exactly `target` tokens in all (lead included) when the counter is exact."""
        words = self._draft(rng, max(1, target))
        tokens = await self.counter.count(lead + " ".join(words))
        for _ in range(MAX_ROUNDS):
            if tokens == target or (tokens < target and not words):
                break
            if tokens > target:  # every word is >= 1 token: dropping the excess lands at or below
                words = words[: max(0, len(words) - (tokens - target))]
            else:  # top up with one-token words
                words += [rng.choice(self.fill) for _ in range(target - tokens)]
            tokens = await self.counter.count(lead + " ".join(words))
        return Fitted(lead + " ".join(words), tokens)

    async def build(
        self, rng: random.Random, index: int, scenario: Scenario, system: Fitted | None
    ) -> Prompt:
        target = scenario.input_tokens.sample(rng)  # >= 1, as every TokenDist sample
        max_tokens = scenario.output_tokens.sample(rng)
        user = await self.fit(rng, target, scenario.instruction)
        return Prompt(
            index=index,
            system=system.text if system else None,
            text=user.text,
            input_tokens=user.tokens + (system.tokens if system else 0),
            max_tokens=max_tokens,
        )


async def build_prompts(
    builder: PromptBuilder, scenario: Scenario, seed: str, count: int, parallel: int = 8
) -> list[Prompt]:
    """`count` prompts from `seed` (a string: Python seeds str deterministically), fitted `parallel`
    at a time. Each prompt has its own generator, so the set does not depend on call order."""
    prefix = None
    if scenario.shared_prefix_tokens:
        prefix = await builder.fit(random.Random(f"{seed}:prefix"), scenario.shared_prefix_tokens)
    gate = asyncio.Semaphore(parallel)

    async def one(i: int) -> Prompt:
        async with gate:
            return await builder.build(random.Random(f"{seed}:{i}"), i, scenario, prefix)

    return list(await asyncio.gather(*(one(i) for i in range(count))))
