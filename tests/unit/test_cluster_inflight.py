"""A gateway's requests in flight: one is sent again at most once per attempt (a nack is tried
again, one that ended meanwhile is not), and a nack is told apart: full queue or no leader."""

from __future__ import annotations

import asyncio

from aiormq.exceptions import DeliveryError

from outpost.cluster import wire
from outpost.cluster.gateway.inflight import Pending, nack_is_full, resubmit, resume_answer
from outpost.messages import GenerateRequest


def _pending(rid: str) -> Pending:
    return Pending(GenerateRequest(prompt_tokens=[1, 2], max_tokens=4, request_id=rid), "m")


def test_a_request_is_resubmitted_once_per_attempt() -> None:
    item = _pending("a")
    assert item.needs_resubmit()
    assert not item.needs_resubmit()  # a parked copy and a sequence gap both report it: sent once
    item.attempt += 1  # the resubmitted copy was resumed; its replies may be lost in turn
    assert item.needs_resubmit()
    item.finished = True
    item.attempt += 1
    assert not item.needs_resubmit()


def test_a_nacked_resubmission_is_tried_again_and_a_finished_one_is_not() -> None:
    item, other = _pending("a"), _pending("b")
    pending = {"a": item, "b": other}
    tries: list[str] = []

    async def publish(p: Pending) -> None:
        tries.append(p.request.request_id)
        if p is item and tries.count("a") == 1:
            raise DeliveryError(None, None)  # the quorum queue had no leader yet
        if p is other:
            other.finished = True  # ended meanwhile (its deadline): not sent again
            raise DeliveryError(None, None)

    async def both() -> list[bool]:
        return [await resubmit(pending, item, publish), await resubmit(pending, other, publish)]

    assert asyncio.run(both()) == [True, False]
    assert tries == ["a", "a", "b"]


def test_a_nack_is_a_full_queue_only_at_its_limit() -> None:
    assert nack_is_full(100, 100) and nack_is_full(95, 100)
    assert not nack_is_full(3, 100)  # far below: the queue could not take it (no leader)
    assert not nack_is_full(None, 100)  # the depth could not be read either: unavailable
    assert not nack_is_full(100, None)  # no length policy in force: never "full"
    assert nack_is_full(0, 1)


def test_a_resume_question_asked_again_gets_the_same_answer() -> None:
    item = _pending("a")
    item.sent, item.next_seq = [7, 8], 2
    first, new = resume_answer(item, wire.ResumeQuery("a", "w1"))
    assert new and (first.attempt, first.seq, first.token_ids) == (1, 2, [7, 8])
    again, new = resume_answer(item, wire.ResumeQuery("a", "w1"))  # its first answer was lost
    assert not new and again == first
    other, new = resume_answer(item, wire.ResumeQuery("a", "w2"))  # another copy: a new attempt
    assert new and other.attempt == 2
    old, new = resume_answer(item, wire.ResumeQuery("a"))  # an earlier v1 worker names no asker
    assert new and old.attempt == 3
    item.finished = True
    assert resume_answer(item, wire.ResumeQuery("a", "w3")) == (wire.ResumeState("a", 0, 0, gone=True), False)
    assert resume_answer(None, wire.ResumeQuery("b", "w3"))[0].gone


def test_after_a_lost_reply_queue_only_started_requests_nobody_asked_about_are_sent_again() -> None:
    from outpost.cluster.gateway.inflight import silent_since

    def item(rid: str, seq: int, attempt: int, heard: float, finished: bool = False) -> Pending:
        p = _pending(rid)
        p.next_seq, p.attempt, p.heard, p.finished = seq, attempt, heard, finished
        return p

    pending = {
        "done-replies-lost": item("done-replies-lost", 3, 0, heard=5.0),
        "resumed-since": item("resumed-since", 3, 1, heard=12.0),  # its worker asked `resume?`
        "waiting": item("waiting", 0, 0, heard=1.0),  # still in the quorum queue, which kept it
        "finished": item("finished", 4, 0, heard=5.0, finished=True),
    }
    assert [p.request.request_id for p in silent_since(pending, since=10.0)] == ["done-replies-lost"]
