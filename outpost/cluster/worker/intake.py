"""A worker's intake: exactly `slots` one-message consumers, spread over its lane and the shared queue.

Pull balancing needs a hard bound: a worker never holds more unacked requests than it has slots.
Quorum queues have no channel-wide prefetch, and a worker reads two queues (its lane, for requests
routed to it for their prefix, and the model's shared queue), so each slot is a *credit*: one
consumer with prefetch 1 on one of the two queues. However the credits are spread, at most
`slots` requests are held. A credit moves between the queues only while it holds nothing, and
only after the broker has confirmed its cancel (any delivery sent before the cancel arrives
first), so the bound holds during a move too.

`CreditPlan` (pure) decides the moves: idle credits go where requests wait (queue depths polled a
few times a second, and a delivery that took a queue's last idle credit hints at more). A guess
leaves each queue one credit, so nothing waits for a poll; requests known to wait may take every
idle credit, so a worker serves all its slots from one queue when only that one has work. `Intake`
carries them out with aio-pika and runs each delivery as a task.

Beside the credits, `Intake` reads the model's resume queue (broker/topology.py) on a channel of its
own, `slots` messages at a time: requests that may have streamed tokens already, whose worker or
broker node went. They are taken at once, over the credits' bound (a worker then holds up to twice
its slots), and its engine runs them before any request that has not started (the scheduler puts
a resumed request ahead of the waiting ones), so a stream that lost its worker waits for the next
free slot, not for the queue ahead of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from aiormq.exceptions import AMQPError

_log = logging.getLogger("outpost.cluster.intake")

LANE = "lane"
SHARED = "shared"
DEPTH_POLL_S = 0.25
Handle = Callable[[AbstractIncomingMessage], Awaitable[None]]
RPC_TIMEOUT_S = 10.0  # a consume or cancel the broker never answers (a connection going away)


@dataclass(eq=False)
class Credit:
    """One consumer with prefetch 1: at most one unacked request (more only after a channel break)."""

    index: int
    source: str  # LANE or SHARED: where it consumes, or will once its move completes
    tag: str | None = None  # the consumer tag while consuming
    held: int = 0
    moving: bool = False

    @property
    def idle(self) -> bool:
        return self.held == 0 and not self.moving and self.tag is not None


class CreditPlan:
    """The credits and where they should be; no I/O."""

    def __init__(self, slots: int, lane: bool) -> None:
        n_lane = slots // 2 if lane else 0
        self.credits = [Credit(i, LANE if i < n_lane else SHARED) for i in range(slots)]
        self.sources = (LANE, SHARED) if lane else (SHARED,)
        # Each queue keeps a credit (nothing waits for a depth poll), unless there is only one.
        self._floor = 1 if slots > 1 else 0

    def count(self, source: str) -> int:
        return sum(c.source == source for c in self.credits)

    def moves(self, depths: dict[str, int], hint: str | None = None) -> list[tuple[Credit, str]]:
        """Idle credits to move so waiting requests find one.

        `depths`: messages ready in each queue (may be stale); `hint`: the queue whose delivery
        just took its last idle credit (more may be right behind it). For requests known to wait
        any idle credit may move; for a hint (a guess) each queue keeps one, so a request arriving
        there does not wait for a depth poll. Either way a credit leaves a queue only while
        nothing waits there."""
        if len(self.sources) < 2:
            return []
        idle = {s: [c for c in self.credits if c.source == s and c.idle] for s in self.sources}
        count = {s: self.count(s) for s in self.sources}
        moves: list[tuple[Credit, str]] = []
        for want, other in ((LANE, SHARED), (SHARED, LANE)):
            waiting = depths.get(want, 0)
            floor = 0 if waiting > len(idle[want]) else self._floor
            if hint == want and not idle[want]:
                waiting = max(waiting, 1)
            need = waiting - len(idle[want])
            spare = len(idle[other]) - depths.get(other, 0)
            while need > 0 and spare > 0 and count[other] > floor:
                credit = idle[other].pop()
                moves.append((credit, want))
                count[other] -= 1
                count[want] += 1
                need -= 1
                spare -= 1
        return moves


class Intake:
    """Runs the credits on one channel: consumes, moves, and hands each delivery to `handle`."""

    def __init__(
        self,
        channel: AbstractChannel,
        queues: dict[str, AbstractQueue],
        slots: int,
        handle: Handle,
        depth: Callable[[str], Awaitable[int]],
    ) -> None:
        """depth(source): messages ready in that queue, read on a channel of its own (a failed
        declare closes its channel, which must be neither this one nor the one replies go out on)."""
        self.plan = CreditPlan(slots, LANE in queues)
        self._channel = channel
        self._depth = depth
        self._queues = queues
        self._handle = handle
        self.tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._moves = 0
        self._resume: AbstractQueue | None = None
        self._resume_tag: str | None = None

    async def start(self, resume: AbstractQueue | None = None, on_resume: Handle | None = None) -> None:
        """Consume with every credit; and `resume` (a queue on a channel of its own) `slots` at a
        time, each delivery handed to `on_resume`."""
        if resume is not None and on_resume is not None:  # first: what waits there is delivered first
            await resume.channel.set_qos(prefetch_count=len(self.plan.credits))
            self._resume = resume
            consume = functools.partial(self._on_resume, on_resume)
            self._resume_tag = await resume.consume(consume, timeout=RPC_TIMEOUT_S)
        await self._channel.set_qos(prefetch_count=1)  # per consumer: each credit holds one
        for credit in self.plan.credits:
            await self._consume(credit)

    async def stop(self) -> None:
        """No new deliveries; what is held runs on (see `tasks`)."""
        self._stopping = True
        for credit in self.plan.credits:
            await self._cancel(credit)
        if self._resume is not None and self._resume_tag is not None:
            with contextlib.suppress(AMQPError, RuntimeError, asyncio.TimeoutError):
                await self._resume.cancel(self._resume_tag, timeout=RPC_TIMEOUT_S)

    def abandon(self) -> None:
        """The worker is going away without draining: cancel what runs here and consume nothing
        more. Nothing held is acked, so the broker redelivers it when the connection closes."""
        self._stopping = True
        for task in self.tasks:
            task.cancel()

    @property
    def held(self) -> int:
        return sum(c.held for c in self.plan.credits)

    async def rebalance(self, depths: dict[str, int], hint: str | None = None) -> None:
        if self._stopping:
            return
        moves = self.plan.moves(depths, hint)
        for credit, _ in moves:
            credit.moving = True
        await asyncio.gather(*(self._move(c, to) for c, to in moves))

    async def watch(self) -> None:
        """Poll the queues' depths and rebalance; re-consume credits the broker cancelled (aiormq
        drops a broker's basic.cancel silently, so a cancelled consumer would just go quiet)."""
        tick = 0
        while not self._stopping:
            await asyncio.sleep(DEPTH_POLL_S)
            with contextlib.suppress(AMQPError, RuntimeError, asyncio.TimeoutError, OSError):
                if self._channel.is_closed:
                    continue
                await self.rebalance(await self._depths())
                tick += 1
                if tick % 4 == 0:
                    await self._reconsume_lost()

    async def _depths(self) -> dict[str, int]:
        return {source: await self._depth(source) for source in self._queues}

    async def _reconsume_lost(self) -> None:
        underlay = await self._channel.get_underlay_channel()
        consumers: dict[str, object] = getattr(underlay, "consumers", {})  # aiormq's, untyped
        for credit in self.plan.credits:
            if credit.tag is not None and not credit.moving and credit.tag not in consumers:
                _log.warning("the broker cancelled a consumer of %s; consuming again", credit.source)
                credit.tag = None
                if credit.held == 0:
                    await self._consume(credit)

    async def _consume(self, credit: Credit) -> None:
        if self._stopping:
            return
        queue = self._queues[credit.source]
        credit.tag = await queue.consume(functools.partial(self._on_message, credit), timeout=RPC_TIMEOUT_S)

    async def _cancel(self, credit: Credit) -> None:
        tag, credit.tag = credit.tag, None
        if tag is not None:
            with contextlib.suppress(AMQPError, RuntimeError, asyncio.TimeoutError):
                await self._queues[credit.source].cancel(tag, timeout=RPC_TIMEOUT_S)
            # Deliveries the broker sent before its cancel-ok have had their callbacks scheduled
            # ahead of this coroutine's wake-up; one more turn lets them count as held.
            await asyncio.sleep(0)

    async def _move(self, credit: Credit, to: str) -> None:
        try:
            await self._cancel(credit)
            credit.source = to
            self._moves += 1
        finally:
            credit.moving = False
        if credit.held == 0:  # else it consumes again when its request ends
            await self._consume(credit)

    async def _on_message(self, credit: Credit, message: AbstractIncomingMessage) -> None:
        credit.held += 1
        task = asyncio.ensure_future(self._run(credit, message))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if not any(c.idle for c in self.plan.credits if c.source == credit.source):
            await self.rebalance({}, hint=credit.source)

    async def _on_resume(self, handle: Handle, message: AbstractIncomingMessage) -> None:
        if self._stopping:
            return  # not acked: the broker gives it to another worker when this channel closes
        task = asyncio.ensure_future(handle(message))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(self, credit: Credit, message: AbstractIncomingMessage) -> None:
        try:
            await self._handle(message)
        finally:
            credit.held -= 1
            if credit.held == 0 and credit.tag is None and not credit.moving and not self._stopping:
                with contextlib.suppress(AMQPError, RuntimeError, asyncio.TimeoutError):
                    await self._consume(credit)
