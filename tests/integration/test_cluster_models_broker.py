"""A worker of several models over a real broker, with a model pool of fake models (no model).

One `Worker` serves two models of serve's `ModelPool` (`--models-max 1`), each as a `ServedModel`
with its own queue; a gateway link of both models sends requests to each. Each is answered by its
own model, loaded by that request (the other one unloaded for it), and a request whose model cannot
load within the pool's wait (its load held on an event the test sets afterwards) ends with one final
error event giving the pool's reason and its Retry-After (the client's 503, as serve's), not lost and
not hanging; once the load is let go, the next request for that model is answered.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from fake_backend import FakeSource
from test_cluster_broker import collect, request, run, until

from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.worker.served import ServedModel
from outpost.cluster.worker.service import Worker
from outpost.messages import FinishReason
from outpost.serving.model_pool import ModelPool, PoolLimits

pytestmark = pytest.mark.cluster


def test_one_worker_serves_each_model_of_its_pool_from_its_queue(rabbitmq: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    names = (f"pool-a-{tag}", f"pool-b-{tag}")
    sources = {name: FakeSource() for name in names}
    pool = ModelPool(sources, PoolLimits(models_max=1, load_wait_s=0.5))
    a, b = names

    async def text(link: GatewayLink, model: str) -> tuple[str, Any]:
        events = await collect(await RemoteBackend(link, model, None).submit(request(max_tokens=8)))  # type: ignore[arg-type]
        return "".join(e.text for e in events), events[-1]

    async def main() -> None:
        link = GatewayLink(rabbitmq.url, list(names))
        await link.start()
        served = [ServedModel(name, model, 1) for name, model in pool.models.items()]
        stop = asyncio.Event()
        task = asyncio.ensure_future(Worker(rabbitmq.url, served, worker_id=f"pool-{tag}").run(stop))
        try:
            await until(lambda: {w["model"] for w in link.live_workers()} == set(names), "both heartbeats")
            assert {(w["model"], w["loaded"]) for w in link.live_workers()} == {(a, False), (b, False)}
            for model, other in ((a, b), (b, a)):
                said, final = await text(link, model)
                assert (said, final.finish_reason) == ("hello", FinishReason.STOP)
                assert (pool.models[model].status, pool.models[other].status) == ("loaded", "unloaded")
            sources[a].gate.clear()  # a's next load is held: the pool's 0.5 s wait ends first
            said, final = await text(link, a)
            # The pool's reason, naming the model ("still loading", or "no room" while b unloads).
            assert final.finish_reason is FinishReason.ERROR and repr(a) in (final.error or "")
            assert final.error_retry_after is not None and final.error_retry_after > 0
            sources[a].gate.set()
            await until(lambda: pool.models[a].status == "loaded", f"{a} loaded")
            said, final = await text(link, a)
            assert (said, final.finish_reason) == ("hello", FinishReason.STOP)
        finally:
            stop.set()
            await asyncio.wait({task}, timeout=30)
            await link.close()
            for model in pool.models.values():
                model.close()

    run(main())
