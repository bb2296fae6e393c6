"""The gateway's bound on waiting requests (`--max-queue`): counted here, not left to the broker.

RabbitMQ's `max-length` with `reject-publish` on a quorum queue does not hold under concurrent
publishers (Debian's 3.10.8 showed 44 ready under a limit of 32, and 200 concurrent requests were
all accepted in one run): the leader checks the length against messages it has not yet applied.
So each gateway counts the requests it has sent that no worker has started yet (no reply batch,
no resume question) and refuses past its share of the bound: `--max-queue` divided by the
gateways serving the model, which it reads through the broker (every gateway of a model consumes
the model's presence queue `outpost.gateways.<model>`, so its consumer count is their number). One
gateway's bound is exact; several each keep `max_queue // gateways` (at least 1). The broker
policy stays as a second, looser bound. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from outpost.cluster.gateway.inflight import Pending


def share(max_queue: int, gateways: int) -> int:
    """This gateway's part of `max_queue` when `gateways` gateways (this one included) are connected."""
    return max(1, max_queue // max(1, gateways))


def waiting(pending: Iterable[Pending], model: str) -> int:
    """Requests of `model` sent and not yet started by any worker (in the queue, or just taken)."""
    return sum(1 for p in pending if p.model == model and not p.started and not p.finished)


def full(
    pending: Iterable[Pending], model: str, max_queue: int | None, gateways: int, extra: int = 0
) -> bool:
    """Whether one more request of `model` would pass this gateway's share of the bound; `extra`:
    other jobs of the model in the queue (embedding calls in flight)."""
    if max_queue is None:
        return False
    return waiting(pending, model) + extra >= share(max_queue, gateways)
