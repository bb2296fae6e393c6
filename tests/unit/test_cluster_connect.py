"""A broker connection cancelled while it is being made leaves nothing running.

aio-pika's robust connection keeps a reconnect task that ignores cancellation until the connection
is closed; a worker or gateway stopped while the broker has not answered yet must not leave it
behind (the event loop would wait on it forever at exit). The "broker" here accepts the TCP
connection and never speaks AMQP, so the connect is certainly in flight when it is cancelled.
"""

from __future__ import annotations

import asyncio

from outpost.cluster.broker import connection


async def _silent_server() -> tuple[asyncio.Server, asyncio.Event, int]:
    accepted = asyncio.Event()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # until the client goes away; never a byte back
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, accepted, port


def test_a_connect_cancelled_in_flight_leaves_no_task_behind() -> None:
    async def main() -> set[asyncio.Task[object]]:
        server, accepted, port = await _silent_server()
        async with server:
            connecting = asyncio.ensure_future(connection.connect(f"amqp://u:p@127.0.0.1:{port}/", "test"))
            await asyncio.wait_for(accepted.wait(), 30)
            connecting.cancel()
            await asyncio.wait({connecting}, timeout=30)
            assert connecting.cancelled()
            others = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
            others = {t for t in others if "on_client" not in repr(t)}  # the fake broker's own
            if others:
                await asyncio.wait(others, timeout=10)
            return {t for t in others if not t.done()}

    loop = asyncio.new_event_loop()
    try:
        left = loop.run_until_complete(main())
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()
    assert not left, left
