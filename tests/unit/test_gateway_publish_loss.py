"""A gateway's publish cut off by its connection (no broker): aiormq cancels the confirm it waits on
when it finds the connection stuck, a `CancelledError` that is the link's, not the request's. The
client gets serve's 503 with Retry-After, never an unhandled exception (a 500); a request whose own
task is cancelled (its client left) still ends as a cancellation."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from outpost.cluster.gateway.link import GatewayLink
from outpost.messages import BackendUnavailable, GenerateRequest, SamplingParams


class _StuckExchange:
    """Stands for aiormq's channel: the confirm is cancelled as the connection is found stuck, or
    waits until the caller's own task is cancelled."""

    def __init__(self, cut: bool) -> None:
        self.cut = cut
        self.published = asyncio.Event()

    async def publish(self, *_: Any, **__: Any) -> None:
        self.published.set()
        if self.cut:
            raise asyncio.CancelledError  # the connection's doing
        await asyncio.Event().wait()  # until this task is cancelled


def _link(exchange: _StuckExchange) -> GatewayLink:
    link = GatewayLink("amqp://127.0.0.1:1/", ["m"], gateway_id="g")
    session = SimpleNamespace(connected=asyncio.Event())
    session.connected.set()
    link._session = session  # type: ignore[assignment]
    link._conn = object()  # type: ignore[assignment]
    link._pub = SimpleNamespace(default_exchange=exchange)  # type: ignore[assignment]
    return link


def _request(rid: str) -> GenerateRequest:
    return GenerateRequest(request_id=rid, prompt_tokens=[1, 2, 3], max_tokens=4, sampling=SamplingParams())


def test_a_publish_the_connection_cancels_is_a_503_with_retry_after() -> None:
    asyncio.run(asyncio.wait_for(_cut(), 30))


async def _cut() -> None:
    link = _link(_StuckExchange(cut=True))
    with pytest.raises(BackendUnavailable) as refused:
        await link.submit("m", _request("r1"))
    assert refused.value.retry_after > 0 and "r1" not in link.pending
    for job in list(link._jobs):  # the cancel it sends once the link is back: not this test's
        job.cancel()


def test_a_request_whose_client_left_is_still_cancelled() -> None:
    asyncio.run(asyncio.wait_for(_client_left(), 30))


async def _client_left() -> None:
    exchange = _StuckExchange(cut=False)
    link = _link(exchange)
    task = asyncio.ensure_future(link.submit("m", _request("r2")))
    await asyncio.wait_for(exchange.published.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert "r2" in link.pending  # left for the client's cancel, which sends it to the workers
