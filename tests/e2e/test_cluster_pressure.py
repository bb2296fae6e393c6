"""The cluster under pressure, driven like a user would: `outpost gateway` + `outpost worker` processes
over a real rabbitmq-server, real HTTP clients.

The worker paces its engine steps (OUTPOST_DEBUG_STEP_DELAY_MS) so that no request can finish while
the test sends its burst, whatever the machine's speed: what the gateway admits depends only on
the bound, never on how fast the engine or the machine is.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_harness import Gateway, live, worker

pytestmark = pytest.mark.cluster
BURST = 200
MAX_QUEUE = 32
SLOTS = 2
# 200 ms a step, 2,000 tokens each: a request lasts 400 s, far beyond the burst on any machine.
STEP_MS = 200
MAX_TOKENS = 2000


def _model_named(tiny_model: Path, folder: Path, name: str) -> Path:
    """The tiny model under a name of its own: a queue no other test (or run) shares, so what an
    earlier run left in its queue cannot count against this one."""
    path = folder / f"{name}.gguf"
    shutil.copyfile(tiny_model, path)
    return path


async def _burst(url: str, model: str) -> list[httpx.Response]:
    """BURST concurrent streamed completions; each answer's head (status, headers) once all are in.
    Accepted streams are held open until then (they stay in their slot or in the queue), then closed."""
    heads: list[asyncio.Future[httpx.Response]] = [
        asyncio.get_running_loop().create_future() for _ in range(BURST)
    ]
    release = asyncio.Event()
    body = {
        "model": model,
        "prompt": "The quick brown fox",
        "max_tokens": MAX_TOKENS,
        "stream": True,
        "ignore_eos": True,
    }
    limits = httpx.Limits(max_connections=BURST + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def one(head: asyncio.Future[httpx.Response]) -> None:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                head.set_result(response)
                await release.wait()

        tasks = [asyncio.ensure_future(one(h)) for h in heads]
        try:
            done = await asyncio.wait_for(asyncio.gather(*heads), 180)
        finally:
            release.set()
            await asyncio.gather(*tasks, return_exceptions=True)
    return list(done)


@pytest.mark.parametrize("run", range(3))
def test_max_queue_bounds_a_burst_every_time(
    rabbitmq: Any, tiny_model: Path, tmp_path: Path, run: int
) -> None:
    """200 concurrent requests, one `-np 2` worker, `--max-queue 32`: at most 32 wait and 2 run
    (the count is the gateway's, so no race among publishers lets more in); every other request is
    429 with Retry-After, answered at once. Three runs: the bound holds in each, not on average."""
    pressure_model = _model_named(tiny_model, tmp_path, f"cluster-pressure-{run}")
    gateway = Gateway(rabbitmq, [pressure_model], "--max-queue", str(MAX_QUEUE))
    held = worker(rabbitmq, pressure_model, "-np", str(SLOTS), step_delay_ms=STEP_MS)
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "one live worker")
        answers = asyncio.run(_burst(gateway.url, pressure_model.stem))
        accepted = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code != 200]
        # At least the bound (nothing ends during the burst, so nothing frees room early) and at
        # most the bound plus the slots: requests a worker has started no longer wait.
        assert MAX_QUEUE <= len(accepted) <= MAX_QUEUE + SLOTS, (
            len(accepted),
            sorted({(a.status_code, a.text[:300]) for a in refused}),
            gateway.stderr()[-3000:],
        )
        for answer in refused:
            assert answer.status_code == 429, answer.text
            assert answer.json()["error"]["code"] == "queue_full"
            assert answer.headers["retry-after"].isdigit()
    finally:
        held.stop()
        gateway.stop()
