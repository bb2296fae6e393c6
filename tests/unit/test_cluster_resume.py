"""A worker's side of a resume: the question asked again until answered (one asker id throughout),
and a request its gateway cannot be reached for handed back rather than dropped. The exchange is a
fake that keeps what is published; no broker."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiormq.exceptions import PublishError

from outpost.cluster import wire
from outpost.cluster.worker import resume


class Exchange:
    """Keeps each publish; `on_publish(n)` may answer or raise on the n-th (1-based)."""

    def __init__(self, on_publish: Any = None) -> None:
        self.published: list[tuple[str, bytes]] = []
        self.on_publish = on_publish

    async def publish(self, message: Any, routing_key: str, **_: Any) -> None:
        self.published.append((routing_key, message.body))
        if self.on_publish is not None:
            self.on_publish(len(self.published))


def test_a_lost_resume_question_is_asked_again_with_the_same_asker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resume, "RESUME_RETRY_S", 0.05)
    state = wire.ResumeState("r1", 1, 4, [5, 6])

    async def scenario() -> tuple[wire.ResumeState | None, Exchange]:
        answer: asyncio.Future[wire.ResumeState] = asyncio.get_running_loop().create_future()

        def on_publish(n: int) -> None:
            if n == 3:  # the first two questions went to a reply queue on a dead node
                answer.set_result(state)

        exchange = Exchange(on_publish)
        got = await resume.ask_resume(exchange, "private", "r1", "outpost.reply.g", answer, lambda: 100.0)  # type: ignore[arg-type]
        return got, exchange

    got, exchange = asyncio.run(scenario())
    assert got == state
    queries = [wire.decode_resume_query(body) for _, body in exchange.published]
    assert len(queries) == 3 and len({q.asker for q in queries}) == 1 and queries[0].asker
    assert {key for key, _ in exchange.published} == {"outpost.reply.g"}


def test_no_answer_at_all_returns_the_request_to_the_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resume, "RESUME_RETRY_S", 0.02)
    monkeypatch.setattr(resume, "RESUME_TIMEOUT_S", 0.1)

    async def scenario() -> None:
        answer: asyncio.Future[wire.ResumeState] = asyncio.get_running_loop().create_future()
        await resume.ask_resume(Exchange(), "private", "r1", "outpost.reply.g", answer, lambda: 100.0)  # type: ignore[arg-type]

    with pytest.raises(resume.ResumeUnanswered):
        asyncio.run(scenario())


def test_a_request_is_handed_back_to_its_gateways_parked_queue() -> None:
    exchange = Exchange()
    assert asyncio.run(resume.park(exchange, b"body", "r1", "outpost.reply.g1"))  # type: ignore[arg-type]
    assert exchange.published == [("outpost.parked.g1", b"body")]

    def unroutable(_: int) -> None:
        # No parked queue either (the gateway is gone for good): the broker returns the message.
        raise PublishError.__new__(PublishError)

    assert not asyncio.run(resume.park(Exchange(unroutable), b"body", "r1", "outpost.reply.g1"))  # type: ignore[arg-type]
