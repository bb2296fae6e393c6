"""A worker's memory of cancels: plain ones stop a request wherever it is; superseding ones
(sent when a gateway answers a resume) stop only copies of an older attempt."""

from __future__ import annotations

from outpost.cluster.worker.cancels import CancelMemory


def test_a_plain_cancel_stops_a_running_copy_or_waits_for_the_request() -> None:
    memory = CancelMemory()
    memory.started("a", 0)
    assert memory.should_stop("a", None)
    assert not memory.should_stop("b", None)  # not here yet: remembered
    assert memory.take_cancelled("b")
    assert not memory.take_cancelled("b")  # once


def test_a_superseding_cancel_stops_older_attempts_only() -> None:
    memory = CancelMemory()
    memory.started("old", 0)
    memory.started("new", 2)
    assert memory.should_stop("old", 1)
    assert not memory.should_stop("new", 2)  # the copy that was just given attempt 2 runs on
    assert not memory.should_stop("new", 1)


def test_a_superseded_request_drops_first_copies_but_not_resuming_ones() -> None:
    memory = CancelMemory()
    assert not memory.should_stop("r", 1)  # nothing running here: remembered as superseded
    assert memory.superseded("r")  # a later first delivery (attempt 0) is dropped
    assert not memory.take_cancelled("r")  # it is not a client's cancel: a resuming copy runs


def test_an_ended_copy_is_not_stopped_and_memory_is_bounded() -> None:
    memory = CancelMemory(memory=3)
    memory.started("a", 0)
    memory.ended("a")
    assert not memory.should_stop("a", None)  # remembered instead
    for i in range(10):
        memory.should_stop(f"x{i}", 1)
    assert not memory.superseded("x0") and memory.superseded("x9")
