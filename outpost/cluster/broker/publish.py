"""The one publish-and-retry: a message to a gateway's reply queue, which may be declared again.

After its own (re)connect, a process takes an unroutable message (the gateway's reply queue is not
there) as "that gateway is still reconnecting" for GATEWAY_GRACE_S (it declares its reply queue again
after the same outage) and tries again every RETRY_S; later, unroutable means the gateway is gone.
Worker replies (worker/requests.py), resume questions (worker/resume.py) and the dead-letter verdicts
(gateway/verdicts.py) all go this way. `request_message` is how a request is put on a queue, by its
gateway or by a worker passing one on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from aiormq.exceptions import PublishError

from outpost.cluster.broker.session import GATEWAY_GRACE_S

RETRY_S = 0.5


async def publish_to_gateway(
    publish: Callable[[], Awaitable[object]], since_connected: Callable[[], float]
) -> bool:
    """Run `publish` until the broker routes it: True then. False once the gateway is gone: unroutable
    while this process has been connected for GATEWAY_GRACE_S or longer."""
    for _ in range(int(GATEWAY_GRACE_S / RETRY_S) + 2):  # bounded: grace / retry interval
        try:
            await publish()
            return True
        except PublishError:
            if since_connected() >= GATEWAY_GRACE_S:
                return False
            await asyncio.sleep(RETRY_S)
    return False


def request_message(
    body: bytes,
    request_id: str | None,
    reply_to: str | None,
    headers: dict[str, Any],
    expiration: float | None,
) -> aio_pika.Message:
    """A request as the queues hold it: persistent, its id as correlation and message id."""
    return aio_pika.Message(
        body,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        correlation_id=request_id,
        message_id=request_id,
        reply_to=reply_to,
        expiration=expiration,
        headers=headers or None,
    )
