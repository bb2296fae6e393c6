"""The `rabbitmq` fixture gives a real, loopback-only RabbitMQ that aio-pika can use and tests can restart."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import uuid
from pathlib import Path

import aio_pika
import httpx
import pytest

from benchmarks.harness.broker import Broker

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


def scheduler_threads(pid: int) -> int:
    """The Erlang VM's normal scheduler threads (named N_scheduler; dirty ones are N_dirty_*_s)."""
    names = [(task / "comm").read_text().strip() for task in Path(f"/proc/{pid}/task").iterdir()]
    return sum(1 for name in names if name.endswith("_scheduler"))


def test_erlang_flags_from_the_environment_reach_the_node(tmp_path: Path) -> None:
    """OUTPOST_BROKER_ERL_ARGS="+S N:N" sets the node's scheduler threads; N is one more than the
    default (one per CPU), so the test cannot pass without the flag."""
    n = len(os.sched_getaffinity(0)) + 1
    broker = Broker(tmp_path / "state", management=False)
    broker.env["OUTPOST_BROKER_ERL_ARGS"] = f"+S {n}:{n}"
    broker.start()
    try:
        pid = int((broker.state_dir / "rabbit.pid").read_text().strip())
        assert scheduler_threads(pid) == n
        queue = f"test.erl.{uuid.uuid4().hex[:8]}"
        assert roundtrip(broker.url, queue, b"n schedulers") == b"n schedulers"
    finally:
        broker.stop()


def test_a_port_taken_after_it_was_picked_fails_the_boot_at_once_and_gets_new_ports(tmp_path: Path) -> None:
    """What CI once hit: between the fixture picking a node's ports and the node binding them,
    something else bound one (eaddrinuse). The node's failure is reported as soon as its VM exits
    (the wait for it is set far beyond the script's timeout, so waiting it out fails this test), and
    the fixture stops what booted and boots again on new ports."""
    broker = Broker(tmp_path / "state", management=False)
    broker.env["OUTPOST_BROKER_WAIT"] = "100000"
    taken = broker.amqp_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        broker.start()
        try:
            assert broker.amqp_port != taken and f":{taken}/" not in broker.broker_url
            queue = f"test.port.{uuid.uuid4().hex[:8]}"
            assert roundtrip(broker.url, queue, b"new ports") == b"new ports"
        finally:
            broker.stop()
