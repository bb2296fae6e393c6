"""The `rabbitmq` fixture gives a real, loopback-only RabbitMQ that aio-pika can use and tests can restart."""

from __future__ import annotations

import asyncio
import stat
import uuid

import aio_pika
import httpx
import pytest
from broker_fixture import Broker

pytestmark = pytest.mark.broker


async def publish(url: str, queue: str, body: bytes) -> None:
    """Declare a durable quorum queue and publish one persistent message, awaiting its confirm."""
    connection = await aio_pika.connect(url, timeout=30)
    async with connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        message = aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT, message_id="m1")
        # With publisher confirms, publish returns once the broker has taken the message.
        await channel.default_exchange.publish(message, routing_key=queue, mandatory=True, timeout=30)


async def consume_one(url: str, queue: str) -> bytes:
    connection = await aio_pika.connect(url, timeout=30)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=1)
        q = await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        async with q.iterator() as messages:
            async for message in messages:
                async with message.process():
                    return message.body
        raise AssertionError("the queue iterator ended without a message")


def roundtrip(url: str, queue: str, body: bytes) -> bytes:
    async def run() -> bytes:
        await publish(url, queue, body)
        return await asyncio.wait_for(consume_one(url, queue), 60)

    return asyncio.run(run())


def queue_info(broker: Broker, queue: str) -> dict[str, object]:
    r = httpx.get(f"{broker.mgmt_url}/api/queues/%2F/{queue}", auth=broker.mgmt_auth, timeout=30)
    r.raise_for_status()
    info: dict[str, object] = r.json()
    return info


def test_quorum_queue_roundtrip_with_confirms(rabbitmq: Broker) -> None:
    queue = f"test.{uuid.uuid4().hex[:8]}"
    assert roundtrip(rabbitmq.url, queue, b"hello broker") == b"hello broker"
    assert queue_info(rabbitmq, queue)["type"] == "quorum"
    mode = stat.S_IMODE(rabbitmq.password_file.stat().st_mode)
    assert mode == 0o600, oct(mode)
    # The credentials are required: a wrong password is refused.
    wrong = rabbitmq.url.replace(rabbitmq.password, "not-the-password")
    with pytest.raises(aio_pika.exceptions.ProbableAuthenticationError):
        asyncio.run(aio_pika.connect(wrong, timeout=30))


def test_broker_restart_keeps_durable_messages(rabbitmq: Broker) -> None:
    queue = f"test.restart.{uuid.uuid4().hex[:8]}"
    asyncio.run(publish(rabbitmq.url, queue, b"survives"))
    rabbitmq.stop()
    assert not rabbitmq.running()
    rabbitmq.start()
    assert rabbitmq.running()
    assert asyncio.run(asyncio.wait_for(consume_one(rabbitmq.url, queue), 60)) == b"survives"
