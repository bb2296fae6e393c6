"""Speculative decoding's policy: how many draft tokens each generating request verifies this step.

A speculating request's decode chunk is its last token followed by draft tokens; the runner
samples at every position of the chunk with the request's own chain, in order, and stops at the
first sampled token that differs from the next draft token (`output.py`). So the output is what
plain decoding would have sampled from the same logits, token for token, greedy or seeded: the
chain sees exactly the tokens it emits, in order (grammar, penalties, RNG). With a deterministic
draft (an n-gram, a greedy draft model) this is standard speculative sampling: a draft token d is
kept with probability p(d), and a rejection samples from p with d removed.

How long a draft. Each request keeps a running estimate p of the chance that a draft token is
accepted, given the one before it was (the geometric model: draft token i survives with p^i),
learnt from its own verifications with a decay so that it follows the text. A draft token is
worth a place in the step when the tokens it is expected to add outweigh what it costs the step:
with r the cost of one more token in a step relative to a one-token step (measured at start,
`SchedulerConfig.spec_token_cost`), a step that so far costs T and yields Y tokens gains from a
token accepted with probability q iff (Y + q) / (T + r) > Y / T, i.e. q * T > r * Y. Tokens go in
order of q / price across requests (for one request q falls with i, so each gets a prefix of its
draft), and the drafts stand only if the step's Y / T beats the plain step's by MARGIN. With many
streams a step is compute-bound (T grows by r per stream and Y by 1): the plain step's rate nears
the best a draft can reach, 1 / r, and speculation turns itself off; with one stream almost any
likely token passes.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from outpost.messages import SpecParams

# Decay of the acceptance counts per verification: about the last 1 / (1 - DECAY) drafts count.
DECAY = 0.8
# The prior: one accepted and one rejected draft token (p starts at 0.5).
PRIOR_ACCEPTED = 1.0
PRIOR_REJECTED = 1.0
# A draft token must be expected to pay for itself this many times over (the cost model is rough).
MARGIN = 1.1
# With no draft verified for this many steps, a request's next draft gets one token as if it
# were likely (the prior): otherwise a request whose estimate fell below the bar would never
# draft again and never learn that the text turned copyable.
PROBE_EVERY = 16


@dataclass
class SpecState:
    """One request's speculation: its settings, acceptance estimate and pending draft."""

    params: SpecParams
    accepted: float = PRIOR_ACCEPTED  # decayed count of accepted draft tokens
    rejected: float = PRIOR_REJECTED  # decayed count of verifications cut short
    draft: list[int] = field(default_factory=list)  # from the draft model, for the next step
    # Steps since its last verification. A new request starts due a probe: its first draft is
    # verified at once, so it learns from its own text from the start.
    idle_steps: int = PROBE_EVERY
    # The draft model has been asked for this request, so its KV holds the history but what came
    # since its last ask.
    draft_asked: bool = False

    @property
    def p(self) -> float:
        """The estimated chance that a draft token is accepted after its predecessor was."""
        return self.accepted / (self.accepted + self.rejected)

    def record(self, n_drafted: int, n_accepted: int) -> None:
        """One verification: `n_accepted` of `n_drafted` draft tokens survived."""
        self.accepted = self.accepted * DECAY + n_accepted
        self.rejected = self.rejected * DECAY + (1.0 if n_accepted < n_drafted else 0.0)

    def useful_length(self, token_cost: float) -> int:
        """The longest draft worth verifying alone in a step (one stream): p^i > MARGIN * r."""
        p = self.p
        bar = MARGIN * token_cost
        if p <= bar:
            return 0
        if p >= 1.0:
            return self.params.n_max
        return min(self.params.n_max, int(math.log(bar) / math.log(p)))


def plan_drafts(
    candidates: list[tuple[SpecState, int]],
    n_decoding: int,
    token_cost: float,
    room: int,
    draft_cost: float = 0.0,
) -> list[int]:
    """Draft tokens each candidate verifies this step (its draft's length capped), in order.

    candidates: (state, tokens its draft offers); n_decoding: one-token decodes in the step;
    room: draft tokens the step can still hold (token budget and free KV cells); draft_cost: what
    making one token costs a `draft` request (its draft model's step), in the same unit.

    Tokens are taken in order of expected tokens per cost, q / price (each request's q falls along
    its draft, so each gets a prefix), and the step keeps the count that yields the most expected
    tokens per cost, if that beats the plain step by MARGIN. The margin is against plain decoding,
    not asked of each token: asked of each, it cut every draft short where the step's rate nears
    1 / price, which is where long, always-accepted drafts (copying) gain most."""
    ks = [0] * len(candidates)
    if room <= 0 or not candidates:
        return ks
    r = max(token_cost, 1e-6)
    cost = 1.0 + (n_decoding - 1) * r
    yielded = float(n_decoding)
    bar = MARGIN * yielded / cost  # what the plain step yields per cost, and the margin
    prices = [r + (draft_cost if state.params.type == "draft" else 0.0) for state, _ in candidates]
    heap = [(-s.p / prices[i], i, s.p) for i, (s, offered) in enumerate(candidates) if offered > 0]
    heapq.heapify(heap)
    # While the next token's q / price beats the step's rate it raises the rate, and every later
    # token is worth less than it: the rate peaks where the first one does not.
    while heap and room > 0:
        neg_value, i, q = heapq.heappop(heap)
        if -neg_value * cost <= yielded:
            break
        ks[i] += 1
        room -= 1
        cost += prices[i]
        yielded += q
        if ks[i] < candidates[i][1]:
            p = candidates[i][0].p
            heapq.heappush(heap, (-(q * p) / prices[i], i, q * p))
    if yielded / cost <= bar:
        return [0] * len(candidates)
    for i, (state, _) in enumerate(candidates):
        if ks[i] < state.params.n_min:
            ks[i] = 0
    return ks


def may_probe(n_decoding: int, token_cost: float, draft_cost: float = 0.0) -> bool:
    """Whether a request whose estimate is under the bar may probe in a step of `n_decoding`
    one-token decodes. Alone, always: a probe then delays nobody else, and it is how a request
    learns that its text turned copyable. Beside other streams, only where a draft token certain
    to be accepted (q = 1) would pay for its place (plan_drafts' test): otherwise a probe can only
    cost, and a draft model's first probe reads the request's whole prompt, stalling every stream."""
    if n_decoding <= 1:
        return True
    r = max(token_cost, 1e-6)
    return 1.0 + (n_decoding - 1) * r > MARGIN * (r + draft_cost) * n_decoding


def catch_up_pays(n_behind: int, n_left: int, token_cost: float, draft_cost: float, read_cost: float) -> bool:
    """Whether a draft model's probe could repay reading the `n_behind` tokens of the request's
    history its KV lacks (`read_cost` each, relative to a target step) over the `n_left` tokens the
    request may still sample: even a draft certain to be accepted saves at most 1 - (r + c) of a
    step per token. A request near its end with a long unread prompt (one left alone at the end of
    a busy pass) does not probe."""
    saving = 1.0 - (max(token_cost, 1e-6) + draft_cost)
    return n_left * saving > n_behind * read_cost


@dataclass(frozen=True)
class SpecCosts:
    """Speculation's prices, each relative to a one-token target step (SchedulerConfig's
    spec_token_cost, draft_token_cost, draft_read_cost), and how they were found: the ready line
    says them, since whether a draft model is ever asked follows from them."""

    token: float
    draft: float
    read: float
    draft_model: bool
    source: str  # "measured", or why a default stands

    def describe(self) -> str:
        text = f"speculation: a draft token {self.token:.2f} of a step"
        if self.draft_model:
            text += f", the draft model {self.draft:.2f} a step and {self.read:.3f} a token read"
        return f"{text} ({self.source})"


def token_cost_from(decode_s: float, per_token_s: float, default: float = 0.15) -> float:
    """r for `SchedulerConfig.spec_token_cost` from measured step times (the default where they
    are not believable)."""
    if not (decode_s > 0 and per_token_s > 0) or per_token_s != per_token_s:
        return default
    return min(max(per_token_s / decode_s, 0.01), 1.0)
