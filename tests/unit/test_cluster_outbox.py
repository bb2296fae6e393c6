"""ReplyOutbox: a worker's replies to one gateway go out as one bundle per confirm, in order per request.

`step_batches` reads a backend's EventStream as the batches a request sends.

The fake publish holds each bundle until the test releases it, so which batches share a bundle is
decided by the test's order of events, not by the machine's speed.
"""

from __future__ import annotations

import asyncio

import pytest

from outpost.cluster import wire
from outpost.cluster.worker.outbox import Outboxes, ReplyOutbox, step_batches
from outpost.messages import FinishReason, TokenEvent


class HeldPublish:
    """Records each published bundle and holds it until `release()`; `fail` makes the next one raise."""

    def __init__(self) -> None:
        self.bundles: list[list[tuple[str, int]]] = []
        self.correlations: list[str] = []
        self.called = asyncio.Event()
        self.gate = asyncio.Event()
        self.fail: Exception | None = None

    async def __call__(self, body: bytes, correlation: str) -> None:
        self.bundles.append([(b.request_id, b.seq) for b in wire.decode_bundle(body)])
        self.correlations.append(correlation)
        self.called.set()
        await self.gate.wait()
        self.gate.clear()
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error

    async def release(self) -> None:
        self.called.clear()
        self.gate.set()
        await asyncio.sleep(0)


def batch(rid: str, seq: int) -> wire.ReplyBatch:
    return wire.ReplyBatch(rid, 0, seq, [TokenEvent(rid, token_ids=[seq])])


def test_batches_that_arrive_during_a_confirm_go_out_together() -> None:
    async def main() -> None:
        publish = HeldPublish()
        box = ReplyOutbox(publish)
        first = asyncio.create_task(box.send(batch("a", 0)))
        await publish.called.wait()  # bundle 1 (a:0) is awaiting its confirm
        later = [asyncio.create_task(box.send(batch(rid, 0))) for rid in ("b", "c", "d")]
        await asyncio.sleep(0)
        assert not first.done()
        await publish.release()
        await first
        await publish.called.wait()  # bundle 2: everything that arrived meanwhile
        assert not any(t.done() for t in later)
        await publish.release()
        await asyncio.gather(*later)
        assert publish.bundles == [[("a", 0)], [("b", 0), ("c", 0), ("d", 0)]]
        assert publish.correlations == ["a", ""]  # a bundle of one keeps its request's id
        assert box.bundles_sent == 2 and box.idle

    asyncio.run(main())


def test_a_request_has_one_batch_in_flight_and_its_batches_stay_in_order() -> None:
    async def main() -> None:
        publish = HeldPublish()
        box = ReplyOutbox(publish)

        async def request(rid: str) -> None:
            for seq in range(3):
                await box.send(batch(rid, seq))

        both = asyncio.gather(*(request(rid) for rid in ("a", "b")))
        for _ in range(10):  # at most 6 bundles
            called = asyncio.create_task(publish.called.wait())
            await asyncio.wait({called, both}, return_when=asyncio.FIRST_COMPLETED)
            if both.done():
                called.cancel()
                break
            await publish.release()
        await both
        for bundle in publish.bundles:
            assert len({rid for rid, _ in bundle}) == len(bundle)  # never two of one request
        for rid in ("a", "b"):
            assert [seq for bundle in publish.bundles for r, seq in bundle if r == rid] == [0, 1, 2]

    asyncio.run(main())


def test_an_unroutable_bundle_fails_every_request_in_it_and_the_next_still_goes() -> None:
    class Unroutable(Exception):
        pass

    async def main() -> None:
        publish = HeldPublish()
        box = ReplyOutbox(publish)
        first = asyncio.create_task(box.send(batch("a", 0)))
        await publish.called.wait()
        publish.fail = Unroutable("gateway gone")
        second = [asyncio.create_task(box.send(batch(rid, 0))) for rid in ("b", "c")]
        await publish.release()  # bundle 1 fails: only a
        with pytest.raises(Unroutable):
            await first
        await publish.called.wait()
        await publish.release()  # bundle 2 (b, c) goes
        await asyncio.gather(*second)
        assert publish.bundles == [[("a", 0)], [("b", 0), ("c", 0)]]

    asyncio.run(main())


def test_a_cancelled_request_does_not_cancel_the_others_bundle() -> None:
    async def main() -> None:
        publish = HeldPublish()
        box = ReplyOutbox(publish)
        a = asyncio.create_task(box.send(batch("a", 0)))
        await publish.called.wait()
        b, c = (asyncio.create_task(box.send(batch(rid, 0))) for rid in ("b", "c"))
        await asyncio.sleep(0)
        await publish.release()
        await a
        await publish.called.wait()
        b.cancel()
        await publish.release()
        await c  # confirmed, though b gave up waiting
        assert b.cancelled()
        assert publish.bundles[1] == [("b", 0), ("c", 0)]

    asyncio.run(main())


def test_outboxes_share_one_box_per_gateway_and_forget_it_after_the_last_request() -> None:
    async def publish(queue: str, body: bytes, correlation: str) -> None:
        return None

    boxes = Outboxes(publish)
    with boxes.open("gw1") as one, boxes.open("gw1") as two, boxes.open("gw2") as other:
        assert one is two and one is not other
        assert len(boxes) == 2
    assert len(boxes) == 0


class Fed:
    """An EventStream the test feeds one event at a time."""

    request_id = "r8"

    def __init__(self) -> None:
        self.feed: asyncio.Queue[TokenEvent] = asyncio.Queue()

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        while True:
            event = await self.feed.get()
            yield event
            if event.finished:
                return

    async def aclose(self) -> None:
        pass


def test_step_batches_gather_what_arrived_while_the_last_was_sent() -> None:
    """While a batch is being sent (the test holds it), the next steps' events pile up and go as
    one batch; the last batch ends with the final event."""

    async def main() -> list[list[TokenEvent]]:
        stream = Fed()
        reader = step_batches(stream)
        stream.feed.put_nowait(TokenEvent("r8", [1], "a"))
        first = await reader.__anext__()
        for i, ch in enumerate("bcd"):
            stream.feed.put_nowait(TokenEvent("r8", [2 + i], ch))
        stream.feed.put_nowait(TokenEvent("r8", finish_reason=FinishReason.STOP))
        for _ in range(20):  # the pump moves them while "sending" the first
            await asyncio.sleep(0)
        rest = [batch async for batch in reader]
        return [first, *rest]

    batches = asyncio.run(main())
    assert ["".join(e.text for e in b) for b in batches] == ["a", "bcd"]
    assert batches[-1][-1].finish_reason is FinishReason.STOP


def test_step_batches_end_a_broken_stream_with_an_error() -> None:
    class Broken:
        request_id = "r9"

        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield TokenEvent("r9", [1], "x")
            raise RuntimeError("engine loop crashed")

        async def aclose(self) -> None:
            pass

    async def main() -> list[list[TokenEvent]]:
        return [batch async for batch in step_batches(Broken())]

    events = [e for batch in asyncio.run(main()) for e in batch]
    assert events[0].text == "x"
    assert events[-1].finish_reason is FinishReason.ERROR and events[-1].error == "engine loop crashed"
