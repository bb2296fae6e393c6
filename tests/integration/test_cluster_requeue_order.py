"""What "interrupted first" rests on, checked on the broker the project installs: a request a worker
held when its connection died goes back to the front of the model's quorum queue, ahead of
requests never delivered (RabbitMQ's quorum queue keeps returned messages apart and serves them
first), so a stream that lost its worker is resumed before any request that has not started."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aio_pika
import pytest
from test_cluster_broker import run

from outpost.cluster.broker import connection, topology

pytestmark = pytest.mark.cluster


def test_a_request_returned_by_a_dead_consumer_is_delivered_before_the_waiting_ones(rabbitmq: Any) -> None:
    model = "test-" + uuid.uuid4().hex[:8]

    async def main() -> None:
        conn = await connection.connect(rabbitmq.url, "order-test")
        dying = await connection.connect(rabbitmq.url, "order-test-dying")
        try:
            pub = await conn.channel(publisher_confirms=True)
            queue = await topology.declare_request_queue(conn, pub, model)
            for i in range(5):
                await pub.default_exchange.publish(aio_pika.Message(str(i).encode()), routing_key=queue.name)
            taken: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
            # A worker's slot takes request 0 and dies holding it (its connection closes unacked).
            doomed_ch = await dying.channel()
            await doomed_ch.set_qos(prefetch_count=1)
            doomed_q = await doomed_ch.declare_queue(queue.name, passive=True)
            await doomed_q.consume(taken.put)
            assert (await asyncio.wait_for(taken.get(), 10)).body == b"0"
            # Another slot takes request 1 and is busy with it while request 0's worker dies.
            ch = await conn.channel()
            await ch.set_qos(prefetch_count=1)
            q = await ch.declare_queue(queue.name, passive=True)
            await q.consume(taken.put)
            busy = await asyncio.wait_for(taken.get(), 10)
            assert busy.body == b"1"
            await dying.close()
            # Request 0 is back in the queue (4 ready: 0, 2, 3, 4) before the busy slot frees.
            deadline = asyncio.get_running_loop().time() + 30
            while await topology.request_queue_depth(pub, model) < 4:
                assert asyncio.get_running_loop().time() < deadline, "request 0 never came back"
                await asyncio.sleep(0.05)
            await busy.ack()  # its slot frees: the next request it gets is the interrupted one
            assert (await asyncio.wait_for(taken.get(), 10)).body == b"0"
            await queue.delete(if_unused=False, if_empty=False)
        finally:
            await dying.close()
            await conn.close()

    run(main())
