"""Per-sequence sampler chains built from `SamplingParams`, with llama.cpp's own samplers.

Order matches llama.cpp's common sampler: logit bias, penalties, then top-k, typical, top-p,
min-p, temperature, and a seeded draw (or greedy at temperature 0).

Plain greedy (temperature 0, no penalties, no grammar) skips the native chain at sampling time:
llama_sampler_sample copies the whole vocabulary into a candidate array every token (~0.15 ms for
a 49k vocabulary, 3% of a 135M model's decode step), where an argmax over the logits row costs
~0.02 ms and picks the same token (the first maximum, as llama.cpp's greedy sampler does).

Given a `HostSampler`, a chain it can do exactly (top-k, top-p, min-p, temperature, bans: the
defaults requests get) samples there instead, without the native chain: the runner samples all
such sequences of a step in one call (outpost/engine/host_sampling.py).

With backend sampling a chain llama.cpp can run in its graph is attached to its sequence
(`attach`): the decode samples it, and `sample()` reads the token back (llama_sampler_sample does,
accepting it into the chain). llama.cpp sets a chain up for one graph once in its life (and skips
its graph samplers on the host after that), so `detach` swaps in a clone, which carries the state
(the draw generator's included) and may be attached again: a preempted request resumed in another
slot continues its seeded draws exactly there; a draft to verify samples on the host.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import numpy.typing as npt

from outpost.engine.host_sampling import HostSampler, HostSequence
from outpost.engine.lib import llama
from outpost.engine.logits import logits_row
from outpost.messages import SamplingParams

_NEG_INF = float("-inf")


class SamplerChain:
    """One native sampler chain; `sample()` picks from a batch output row and accepts the token."""

    def __init__(
        self,
        params: SamplingParams,
        vocab: Any,
        n_vocab: int,
        eog_ids: frozenset[int],
        host: HostSampler | None = None,
    ) -> None:
        """host: sample there when it can do this chain exactly (`self.host` is then set)."""
        self._penalties_index = -1  # where in the chain the penalty sampler sits, if any
        self._n_vocab = n_vocab
        self._argmax_only = is_plain_greedy(params)
        self._bias_ids: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._bias_values: npt.NDArray[np.float32] = np.zeros(0, dtype=np.float32)
        self._bias_set: frozenset[int] = frozenset()
        self._bias_only_lowers = True
        chain_params = llama.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self._chain: Any = llama.llama_sampler_chain_init(chain_params)
        self.seed = params.seed if params.seed is not None else random.getrandbits(32)
        self._host = host
        self.host: HostSequence | None = None
        self.backend_seq: int | None = None  # the sequence whose decode samples this chain
        if host is not None and not self._argmax_only:
            self.host = host.sequence(params, eog_ids, self.seed)
            if self.host is not None:
                return  # no native samplers: a chain with nothing in it costs nothing to keep
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
            self._bias_ids = np.fromiter(biases.keys(), dtype=np.int64, count=len(biases))
            self._bias_values = np.fromiter(biases.values(), dtype=np.float32, count=len(biases))
            self._bias_set = frozenset(biases)
            self._bias_only_lowers = bool((self._bias_values <= 0).all())
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

    def attach(self, ctx: Any, seq_id: int) -> bool:
        """Have llama.cpp sample `seq_id` with this chain in its graph; False where it refused."""
        if self.host is not None or not self._chain:
            return False
        if self.backend_seq is not None:
            self.detach(ctx)
        if not llama.llama_set_sampler(ctx, seq_id, self._chain):
            return False
        self.backend_seq = seq_id
        return True

    def detach(self, ctx: Any) -> None:
        """Back to the host (before the chain is freed, or its sequence changes)."""
        if self.backend_seq is None:
            return
        llama.llama_set_sampler(ctx, self.backend_seq, None)
        self.backend_seq = None
        clone = llama.llama_sampler_clone(self._chain)
        if not clone:
            raise RuntimeError("llama.cpp failed to clone a sampler chain")
        llama.llama_sampler_free(self._chain)
        self._chain = clone

    def sample(self, ctx: Any, output_index: int) -> int:
        if self.backend_seq is not None:  # the decode sampled it; this reads and accepts the token
            return int(llama.llama_sampler_sample(self._chain, ctx, output_index))
        if self.host is not None and self._host is not None:
            return self._host.sample(ctx, [(self.host, output_index)])[0]
        if self._argmax_only:
            return self._argmax(ctx, output_index)
        # llama_sampler_sample already accepts the token into the chain: never accept it again.
        return int(llama.llama_sampler_sample(self._chain, ctx, output_index))

    def _argmax(self, ctx: Any, output_index: int) -> int:
        """Greedy over the logits row (with logit biases added), without the native chain; a
        greedy chain without penalties or grammar keeps no state, so nothing needs accepting."""
        row = logits_row(ctx, output_index, self._n_vocab)
        best = int(row.argmax())
        if not self._bias_ids.size:
            return best
        # The unbiased winner stands when no biased token reaches it; only otherwise copy the row
        # to add the biases. With bans only (ignore_eos) a winner outside them always stands.
        if best not in self._bias_set and (
            self._bias_only_lowers or float((row[self._bias_ids] + self._bias_values).max()) < row[best]
        ):
            return best
        biased = row.copy()
        biased[self._bias_ids] += self._bias_values
        return int(biased.argmax())

    def free(self) -> None:
        if self._chain:
            llama.llama_sampler_free(self._chain)
            self._chain = None


def backend_can_sample(params: SamplingParams) -> bool:
    """Chains llama.cpp's graph samples exactly as the host does: greedy, temperature, top-k,
    top-p, min-p and a seeded draw; not grammar, logit bias, penalties, typical-p nor logprobs
    (which need the raw logits row)."""
    return (
        not params.grammar
        and not params.logit_bias
        and not params.ignore_eos
        and params.repeat_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
        and not 0.0 < params.typical_p < 1.0
        and params.n_probs < 0
    )


def is_plain_greedy(params: SamplingParams) -> bool:
    """Greedy whose choice depends on the logits row and the logit biases alone."""
    return (
        params.temperature <= 0.0
        and not params.grammar
        and params.repeat_penalty == 1.0
        and params.frequency_penalty == 0.0
        and params.presence_penalty == 0.0
    )
