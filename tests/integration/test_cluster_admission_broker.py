"""The queue bound counted by the gateways, over a real broker: each learns from the broker how many
gateways there are, and admits its share of `--max-queue` (no worker: every request waits)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from test_cluster_broker import request, run, until

from outpost.cluster.gateway.link import GatewayLink
from outpost.messages import QueueFull

pytestmark = pytest.mark.cluster


def test_two_gateways_each_admit_half_of_the_bound(rabbitmq: Any) -> None:
    model = "test-" + uuid.uuid4().hex[:8]

    async def main() -> None:
        links = [GatewayLink(rabbitmq.url, [model], max_queue=6) for _ in range(2)]
        for link in links:
            await link.start()
        try:
            await until(lambda: all(link.gateways[model] == 2 for link in links), "both gateways counted")
            other_model = "test-" + uuid.uuid4().hex[:8]
            other = GatewayLink(rabbitmq.url, [other_model], max_queue=6)
            await other.start()  # a gateway of another model: not counted
            await until(lambda: other.queues.rounds >= 1, "the other gateway's first count")
            seen = [link.queues.rounds for link in links]  # polls that may predate it
            await until(
                lambda: all(link.queues.rounds >= n + 2 for link, n in zip(links, seen, strict=True)),
                "two more counts by each gateway",
            )
            await other.close()
            for link in links:
                assert link.gateways[model] == 2
                share = 3
                for _ in range(share):
                    await link.submit(model, request())
                with pytest.raises(QueueFull):
                    await link.submit(model, request())
                assert len(link.pending) == share
        finally:
            for link in links:
                await link.close()

    run(main())
