"""A gateway's requests in flight after its own link was lost: only the ones no worker speaks of
again are resubmitted (a nack is tried again), and a nack is told apart: full queue or no leader."""

from __future__ import annotations

import asyncio
import time

from aiormq.exceptions import DeliveryError

from outpost.cluster.inflight import Pending, nack_is_full, resubmit_silent
from outpost.messages import GenerateRequest


def _pending(rid: str, heard: float) -> Pending:
    return Pending(GenerateRequest(prompt_tokens=[1, 2], max_tokens=4, request_id=rid), "m", heard=heard)


def test_only_requests_nobody_spoke_of_since_the_reconnect_are_resubmitted() -> None:
    since = time.monotonic()
    silent, spoken, done = _pending("a", since - 5), _pending("b", since - 5), _pending("c", since - 5)
    done.finished = True
    pending = {p.request.request_id: p for p in (silent, spoken, done)}
    sent: list[str] = []

    async def publish(p: Pending) -> None:
        sent.append(p.request.request_id)

    async def scenario() -> int:
        job = asyncio.ensure_future(resubmit_silent(pending, since, publish, wait_s=0.05))
        spoken.heard = time.monotonic()  # a redelivered copy asked `resume?` during the wait
        return await job

    assert asyncio.run(scenario()) == 1
    assert sent == ["a"]


def test_a_nacked_resubmission_is_tried_again_and_a_finished_one_is_not() -> None:
    since = time.monotonic()
    item = _pending("a", since - 1)
    other = _pending("b", since - 1)
    pending = {"a": item, "b": other}
    tries: list[str] = []

    async def publish(p: Pending) -> None:
        tries.append(p.request.request_id)
        if p is item and tries.count("a") == 1:
            raise DeliveryError(None, None)  # the quorum queue had no leader yet
        if p is other:
            other.finished = True  # ended meanwhile (its deadline): not sent again
            raise DeliveryError(None, None)

    assert asyncio.run(resubmit_silent(pending, since, publish, wait_s=0)) == 1
    assert tries == ["a", "a", "b"]


def test_a_nack_is_a_full_queue_only_at_its_limit() -> None:
    assert nack_is_full(100, 100) and nack_is_full(95, 100)
    assert not nack_is_full(3, 100)  # far below: the queue could not take it (no leader)
    assert not nack_is_full(None, 100)  # the depth could not be read either: unavailable
    assert not nack_is_full(100, None)  # no length policy in force: never "full"
    assert nack_is_full(0, 1)
