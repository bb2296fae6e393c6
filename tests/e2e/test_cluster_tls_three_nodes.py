"""`outpost gateway` + `outpost worker` over amqps:// to a three-node RabbitMQ cluster
(`scripts/broker.sh start --nodes 3` with OUTPOST_BROKER_TLS_PORT: a TLS listener per node), given
every node's amqps:// address: they serve a request, and a stream in flight when the node they are
connected to is killed (SIGKILL) completes over another node, still over TLS.

The worker paces its steps (OUTPOST_DEBUG_STEP_DELAY_MS), so the stream certainly outlasts the kill
whatever the machine's speed. Every wait is bounded.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import Gateway, Proc, live, worker

from benchmarks.harness.broker import Broker

pytestmark = [pytest.mark.cluster, pytest.mark.broker]
STEP_MS = 150
N_TOKENS = 80  # >= 12 s of paced steps: in flight across the kill


@dataclass
class Via:
    """The cluster as the harness reads a broker: every node's amqps:// URL, node 1's https API."""

    broker_url: str
    password_file: Path
    mgmt_url: str


@pytest.fixture(scope="module")
def cluster3_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker(tmp_path_factory.mktemp("rabbitmq-3-tls"), nodes=3, tls=True).booted() as own:
        yield own


@pytest.fixture(scope="module")
def fleet(
    cluster3_tls: Broker, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    broker = cluster3_tls
    model = tmp_path_factory.mktemp("tls3") / "tls3-tiny.gguf"
    shutil.copyfile(tiny_model, model)
    via = Via(broker.tls_urls, broker.password_file, broker.mgmt_tls_url)
    ca = ["--broker-ca-file", str(broker.ca_file)]
    gateway = Gateway(via, [model], *ca, "--broker-outage", "120")
    procs: list[Proc] = [worker(via, model, "-np", "2", *ca, step_delay_ms=STEP_MS)]
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        yield gateway
    finally:
        for p in procs:
            p.stop()
        gateway.stop()


def _complete(gateway: Gateway, started: threading.Event | None = None) -> tuple[int, str]:
    """(completion tokens, finish reason) of one streamed completion; `started` after 3 chunks."""
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    chunks, usage, finish = 0, -1, ""
    stream = client.completions.create(
        model=model,
        prompt="The quick brown fox",
        max_tokens=N_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            chunks += 1
            if started is not None and chunks >= 3:
                started.set()
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = str(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return usage, finish


def _tls_connections(broker: Broker, node: int) -> dict[str, dict[str, Any]]:
    """outpost-* connections on `node` by role, from its management API over https (CA-verified)."""
    verify = ssl.create_default_context(cafile=str(broker.ca_file))
    port = int(broker.mgmt_tls_url.rsplit(":", 1)[1]) + node - 1
    deadline, found = time.monotonic() + 90, {}
    while time.monotonic() < deadline:
        reply = httpx.get(
            f"https://127.0.0.1:{port}/api/connections", auth=broker.mgmt_auth, verify=verify, timeout=30
        )
        reply.raise_for_status()
        found = {
            str(c["client_properties"]["connection_name"]).split()[0]: c
            for c in reply.json()
            if str(c.get("client_properties", {}).get("connection_name", "")).startswith("outpost-")
        }
        if {"outpost-gateway", "outpost-worker"} <= set(found):
            return found
        time.sleep(0.3)
    raise TimeoutError(f"gateway and worker not both on node {node}: {list(found)}")


def test_three_tls_nodes_serve_and_survive_one_killed(cluster3_tls: Broker, fleet: Gateway) -> None:
    broker = cluster3_tls
    assert _complete(fleet) == (N_TOKENS, "length")
    on_first = _tls_connections(broker, 1)  # both took the first address
    assert all(c["ssl"] for c in on_first.values())
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_complete, fleet, started)
        assert started.wait(180), "the stream did not start"
        broker.kill9(1)  # the node both are connected to
        assert stream.result(timeout=400) == (N_TOKENS, "length")  # resumed over another node
    on_second = _tls_connections(broker, 2)  # the next address, over TLS again
    assert all(c["ssl"] for c in on_second.values())
    assert _complete(fleet) == (N_TOKENS, "length")
    health = fleet.wait_until(lambda h: h.get("broker") == "connected", "the broker", 60)
    assert health.get("resumes", 0) >= 1, health
    broker.start()  # node 1 boots and rejoins
