"""Scenario (a)'s floor: what the broker's two hops cost on this machine, with no Outpost code in them.

Before its first token reaches the client, a request through the gateway crosses RabbitMQ twice:
the gateway's persistent, confirmed publish to the model's quorum queue until the worker's
delivery, and the worker's transient reply to the gateway's own queue until the gateway's
delivery. This probe times both hops with aio-pika alone, one message at a time, on the broker of
the scenario and the CPUs of the calling process, so (a)'s added TTFT can be read against it: the
part above the floor is Outpost's, the floor is what any client of this broker on this machine pays.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika

from benchmarks.cluster.common import ms
from benchmarks.harness.broker import Broker
from outpost.bench.stats import stats

FLOOR_MESSAGES = 200
FLOOR_WARMUP = 20
BODY_BYTES = 600  # about an encoded GenerateRequest of (a)'s prompts


async def _time_hop(
    channel: aio_pika.abc.AbstractChannel, queue: str, message: aio_pika.Message, got: asyncio.Queue[float]
) -> float:
    t0 = time.perf_counter()
    await channel.default_exchange.publish(message, routing_key=queue)
    delivered = await asyncio.wait_for(got.get(), 10.0)
    return delivered - t0


async def _hops(url: str, n: int) -> dict[str, list[float]]:
    """Seconds per hop: the request hop (quorum, persistent, confirmed) and the reply hop."""
    sender = await aio_pika.connect(url)
    receiver = await aio_pika.connect(url)
    try:
        pub = await sender.channel(publisher_confirms=True)
        sub = await receiver.channel()
        await sub.set_qos(prefetch_count=8)
        requests = await sub.declare_queue(
            "floor-requests", durable=True, arguments={"x-queue-type": "quorum"}
        )
        replies = await sub.declare_queue("", exclusive=True)
        got: asyncio.Queue[float] = asyncio.Queue()

        async def on_request(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.put_nowait(time.perf_counter())
            await message.ack()

        async def on_reply(message: aio_pika.abc.AbstractIncomingMessage) -> None:
            got.put_nowait(time.perf_counter())

        await requests.consume(on_request)
        await replies.consume(on_reply, no_ack=True)
        out: dict[str, list[float]] = {"request": [], "reply": []}
        body = b"x" * BODY_BYTES
        for i in range(n + FLOOR_WARMUP):
            persistent = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
            request = await _time_hop(pub, requests.name, persistent, got)
            reply = await _time_hop(pub, replies.name, aio_pika.Message(body[:200]), got)
            if i >= FLOOR_WARMUP:
                out["request"].append(request)
                out["reply"].append(reply)
            await asyncio.sleep(0.005)  # one request at a time, as at 1 stream
        await requests.delete(if_unused=False, if_empty=False)
        return out
    finally:
        await sender.close()
        await receiver.close()


def broker_floor(broker: Broker, n: int = FLOOR_MESSAGES) -> dict[str, Any]:
    """p50/p99 ms of each hop and of their sum (per message), on `broker`, from this process's CPUs."""
    hops = asyncio.run(_hops(broker.url, n))
    both = [a + b for a, b in zip(hops["request"], hops["reply"], strict=True)]
    out: dict[str, Any] = {}
    for name, samples in (("request_hop", hops["request"]), ("reply_hop", hops["reply"]), ("both", both)):
        s = stats(samples)
        out[name] = {"p50": ms(s.p50), "p99": ms(s.p99)}
    out["messages"] = n
    return out
