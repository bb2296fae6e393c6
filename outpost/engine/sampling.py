"""Per-sequence sampler chains built from `SamplingParams`, with llama.cpp's own samplers.

Order matches llama.cpp's common sampler: logit bias, penalties, then top-k, typical, top-p,
min-p, temperature, and a seeded draw (or greedy at temperature 0).
"""

from __future__ import annotations

import random
from typing import Any

from outpost.engine.lib import llama
from outpost.messages import SamplingParams

_NEG_INF = float("-inf")


class SamplerChain:
    """One native sampler chain; `sample()` picks from a batch output row and accepts the token."""

    def __init__(self, params: SamplingParams, vocab: Any, n_vocab: int, eog_ids: frozenset[int]) -> None:
        self._penalties_index = -1  # where in the chain the penalty sampler sits, if any
        chain_params = llama.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain: Any = llama.llama_sampler_chain_init(chain_params)
        self.seed = params.seed if params.seed is not None else random.getrandbits(32)
        try:
            self._build(params, vocab, n_vocab, eog_ids)
        except BaseException:
            self.free()
            raise

    def _add(self, sampler: Any) -> None:
        if not sampler:
            raise RuntimeError("llama.cpp failed to create a sampler")
        llama.llama_sampler_chain_add(self._chain, sampler)  # the chain owns it from here

    def _build(self, p: SamplingParams, vocab: Any, n_vocab: int, eog_ids: frozenset[int]) -> None:
        if p.grammar:
            grammar = llama.llama_sampler_init_grammar(vocab, p.grammar.encode(), b"root")
            if not grammar:
                raise ValueError("the grammar does not parse")
            self._add(grammar)
        biases = dict(p.logit_bias)
        if p.ignore_eos:
            biases.update({t: _NEG_INF for t in eog_ids})
        if biases:
            arr = (llama.llama_logit_bias * len(biases))(
                *[llama.llama_logit_bias(t, b) for t, b in biases.items()]
            )
            self._add(llama.llama_sampler_init_logit_bias(n_vocab, len(biases), arr))
        if p.repeat_penalty != 1.0 or p.frequency_penalty != 0.0 or p.presence_penalty != 0.0:
            self._penalties_index = int(llama.llama_sampler_chain_n(self._chain))
            self._add(
                llama.llama_sampler_init_penalties(
                    n_vocab, p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty
                )
            )
        if p.temperature <= 0.0:
            self._add(llama.llama_sampler_init_greedy())
            return
        if p.top_k > 0:
            self._add(llama.llama_sampler_init_top_k(p.top_k))
        if 0.0 < p.typical_p < 1.0:
            self._add(llama.llama_sampler_init_typical(p.typical_p, 1))
        if 0.0 < p.top_p < 1.0:
            self._add(llama.llama_sampler_init_top_p(p.top_p, 1))
        if p.min_p > 0.0:
            self._add(llama.llama_sampler_init_min_p(p.min_p, 1))
        self._add(llama.llama_sampler_init_temp(p.temperature))
        self._add(llama.llama_sampler_init_dist(self.seed & 0xFFFFFFFF))

    def accept_history(self, tokens: tuple[int, ...]) -> None:
        """Prime the penalty window with prompt tokens, as llama-server does. Only the penalty
        sampler sees them: a grammar must start from the first generated token."""
        if self._penalties_index < 0:
            return
        penalties = llama.llama_sampler_chain_get(self._chain, self._penalties_index)
        for token in tokens:
            llama.llama_sampler_accept(penalties, token)

    def sample(self, ctx: Any, output_index: int) -> int:
        # llama_sampler_sample already accepts the token into the chain: never accept it again.
        return int(llama.llama_sampler_sample(self._chain, ctx, output_index))

    def free(self) -> None:
        if self._chain:
            llama.llama_sampler_free(self._chain)
            self._chain = None
