"""The gateway's share of `--max-queue`: what waits is what no worker has started, per model."""

from __future__ import annotations

from outpost.cluster.gateway import admission
from outpost.cluster.gateway.inflight import Pending
from outpost.messages import GenerateRequest


def _pending(model: str = "m") -> Pending:
    return Pending(GenerateRequest(prompt_tokens=[1, 2], max_tokens=4), model)


def test_the_share_divides_the_bound_among_the_gateways_and_never_reaches_zero() -> None:
    assert admission.share(32, 1) == 32
    assert admission.share(32, 0) == 32  # not read yet: this gateway alone
    assert admission.share(32, 3) == 10  # 3 x 10 <= 32: together they never pass the bound
    assert admission.share(2, 5) == 1


def test_only_unstarted_requests_of_the_model_count_as_waiting() -> None:
    waiting = [_pending() for _ in range(3)]
    replied, resumed, done, other = _pending(), _pending(), _pending(), _pending("other")
    replied.next_seq = 1  # a worker sent its first batch: it holds a slot
    resumed.attempt = 1  # a worker asked to resume it
    done.finished = True
    everything = [*waiting, replied, resumed, done, other]
    assert admission.waiting(everything, "m") == 3
    assert not admission.full(everything, "m", 4, gateways=1)
    assert admission.full(everything, "m", 4, gateways=1, extra=1)  # an embedding job waits too
    assert admission.full(everything, "m", 4, gateways=2)  # a share of 2
    assert not admission.full(everything, "m", None, gateways=1)  # no bound given
