"""deploy/compose.yaml + deploy/compose.cluster.yaml brought up with podman-compose: three RabbitMQ
nodes that form one cluster (by compose.cluster.yaml's own entrypoint: peers, password, cookie), a
gateway and two workers given every node's address; a chat completion through the gateway; then node 1,
the one they are all connected to, killed (`podman kill`) under a streamed request: the stream completes
over another node, a new request is answered, the request queue keeps its three replicas, and node 1
rejoins when started again. `down -v` at the end, even on failure. Real podman, real `openai` client.

tests/deploy/compose/compose.cluster.test.yaml swaps in the RabbitMQ stand-in (rabbitmq.Containerfile,
whose `docker-entrypoint.sh` runs what compose.cluster.yaml's entrypoint execs) and a synthetic model,
and paces the workers' steps (OUTPOST_DEBUG_STEP_DELAY_MS) so the stream outlasts the kill on any
machine. Unlike compose.test.yaml it keeps compose's own network, so the node names and addresses are
compose.cluster.yaml's. podman 4.3 runs no health checks here (no systemd), so the test keeps the file's
`service_healthy` order itself, running each node's own health check (`podman healthcheck run`).
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from podman_harness import (
    COMPOSE_DIR,
    FIGURES,
    ROOT,
    ComposeProject,
    free_ports,
    podman,
    podman_env,
)

pytestmark = pytest.mark.deploy
COMPOSE = [
    ROOT / "deploy" / "compose.yaml",
    ROOT / "deploy" / "compose.cluster.yaml",
    COMPOSE_DIR / "compose.cluster.test.yaml",
]
NODES = ("rabbitmq", "rabbitmq2", "rabbitmq3")
STEP_MS = 150
N_TOKENS = 80  # >= 12 s of paced steps: in flight across the kill
# Bounds, not expectations.
UP_LIMIT_S = 600
READY_LIMIT_S = 300
CLUSTER_LIMIT_S = 180


class ClusterStack(ComposeProject):
    def __init__(self, image: str, rabbitmq_image: str, tmp: Path) -> None:
        self.api_key = secrets.token_hex(16)
        (tmp / "broker_password").write_text(secrets.token_hex(16))
        (tmp / "api_keys").write_text(self.api_key + "\n")
        (tmp / "erlang_cookie").write_text(secrets.token_hex(32))
        (gateway,) = free_ports(1)
        self.url = f"http://127.0.0.1:{gateway}"
        env = {
            **podman_env(),
            "OUTPOST_IMAGE": image,
            "OUTPOST_MODEL": "/models/tiny.gguf",
            "OUTPOST_WORKER_SLOTS": "2",
            "OUTPOST_GATEWAY_PORT": str(gateway),
            "OUTPOST_TEST_RABBITMQ_IMAGE": rabbitmq_image,
            "OUTPOST_TEST_SECRETS": str(tmp),
            "OUTPOST_TEST_STEP_DELAY_MS": str(STEP_MS),
        }
        super().__init__(f"outpost-test-cluster-{os.getpid()}", COMPOSE, env)

    def on(self, node: str, *cmd: str) -> Any:
        """A RabbitMQ CLI command run in `node`'s container, its JSON output (None if it failed)."""
        out = podman("exec", self.container(node), *cmd, "--formatter", "json", timeout=90, check=False)
        if out.returncode != 0:
            return None
        try:
            return json.loads(out.stdout)
        except ValueError:
            return None

    def until(self, what: str, probe: Callable[[], Any], limit_s: float = CLUSTER_LIMIT_S) -> Any:
        """probe()'s first truthy answer (polled, bounded)."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if found := probe():
                return found
            time.sleep(1)
        raise AssertionError(f"{what}: not within {limit_s} s\n{self.logs()}")

    def running_nodes(self, via: str) -> set[str]:
        status = self.on(via, "rabbitmqctl", "cluster_status")
        return set(status.get("running_nodes", [])) if isinstance(status, dict) else set()

    def local_connections(self, node: str) -> int | None:
        """How many client connections `node` itself holds (None if it does not answer)."""
        cmd = ("rabbitmqctl", "eval", "length(rabbit_networking:connections_local()).")
        out = podman("exec", self.container(node), *cmd, timeout=90, check=False)
        return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else None

    def healthy(self, *services: str) -> None:
        """Each service's own health check (the files' `healthcheck`, run by podman) passes (polled)."""
        for svc in services:
            self.until(
                f"{svc} healthy",
                lambda svc=svc: (
                    podman("healthcheck", "run", self.container(svc), check=False).returncode == 0
                ),
                READY_LIMIT_S,
            )

    def request_queues(self, via: str) -> list[dict[str, Any]]:
        queues = self.on(via, "rabbitmqctl", "list_queues", "name", "type", "members", "online") or []
        return [q for q in queues if str(q.get("name", "")).startswith("outpost.req.")]


@pytest.fixture(scope="module")
def stack(
    image: str, rabbitmq_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClusterStack]:
    tmp = tmp_path_factory.mktemp("compose-cluster-secrets")
    tmp.chmod(0o755)
    s = ClusterStack(image, rabbitmq_image, tmp)
    for f in tmp.iterdir():
        f.chmod(0o644)  # bind-mounted; compose.cluster.yaml's entrypoint installs the cookie 0400
    started = time.monotonic()
    try:
        # compose.cluster.yaml's order (depends_on: service_healthy), which podman 4.3 does not keep:
        # node 1 healthy, then nodes 2 and 3 healthy (joined), then the rest.
        for services in (["rabbitmq"], ["rabbitmq2", "rabbitmq3"]):
            up = s.compose("up", "-d", *services, timeout=UP_LIMIT_S)
            assert up.returncode == 0, up.stderr[-4000:]
            s.healthy(*services)
        up = s.compose("up", "-d", timeout=UP_LIMIT_S)
        assert up.returncode == 0, up.stderr[-4000:]
        s.wait_live_workers(s.url, 2, READY_LIMIT_S)
        FIGURES["compose three-node stack (up -d -> gateway /health with 2 live workers)"] = (
            f"{time.monotonic() - started:.1f} s"
        )
        yield s
    finally:
        s.down()


def _client(stack: ClusterStack) -> tuple[openai.OpenAI, str]:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.api_key, max_retries=0, timeout=300)
    return client, client.models.list().data[0].id


def _chat(stack: ClusterStack) -> None:
    client, model = _client(stack)
    out = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0
    )
    assert out.model == model and out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason in ("stop", "length")
    assert out.usage is not None and 1 <= out.usage.completion_tokens <= 8


def _stream(stack: ClusterStack, started: threading.Event) -> tuple[int, str]:
    """(completion tokens, finish reason) of one streamed completion; `started` after 3 chunks."""
    client, model = _client(stack)
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
            if chunks >= 3:
                started.set()
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = str(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return usage, finish


def _three_replicas(stack: ClusterStack, via: str) -> list[dict[str, Any]]:
    """The request queues once each is a quorum queue with a member on every node."""
    want = {f"rabbit@{n}" for n in NODES}
    queues = stack.request_queues(via)
    ok = queues and all(q["type"] == "quorum" and set(q["members"]) == want for q in queues)
    return queues if ok else []


def _survivor_connections(stack: ClusterStack) -> int | None:
    """Client connections held by nodes 2 and 3 together (None if either does not answer)."""
    total = 0
    for node in NODES[1:]:
        held = stack.local_connections(node)
        if held is None:
            return None
        total += held
    return total


def test_three_nodes_form_one_cluster_and_serve(stack: ClusterStack) -> None:
    want = {f"rabbit@{n}" for n in NODES}
    for node in NODES:  # every node sees the same three running
        stack.until(f"3 running nodes seen from {node}", lambda n=node: stack.running_nodes(n) == want)
    _chat(stack)
    stack.until("the request queue on 3 replicas", lambda: _three_replicas(stack, "rabbitmq2"))


def test_a_node_killed_under_a_stream_loses_nothing(stack: ClusterStack) -> None:
    _chat(stack)
    # gateway and workers all took the first address of compose.cluster.yaml's list: node 1
    on_first = stack.until("clients on node 1", lambda: stack.local_connections("rabbitmq"))
    assert [stack.local_connections(n) for n in NODES[1:]] == [0, 0]
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_stream, stack, started)
        assert started.wait(180), "the stream did not start"
        podman("kill", stack.container("rabbitmq"))
        assert stream.result(timeout=400) == (N_TOKENS, "length")  # resumed over another node
    survivors = {"rabbit@rabbitmq2", "rabbit@rabbitmq3"}
    stack.until("node 1 gone", lambda: stack.running_nodes("rabbitmq2") == survivors)
    _chat(stack)
    # ... and every client moved to a surviving node: the next address, node 2, or node 3 after it
    # when a setup there failed (a CI run logged NOT_FOUND for the gateway's reply queue from its
    # setups after node 1's death) and the session moved on to the next address (session.py)
    stack.until("clients on nodes 2 and 3", lambda: _survivor_connections(stack) == on_first)
    queues = stack.request_queues("rabbitmq2")
    assert queues and all(len(q["members"]) == 3 for q in queues), queues  # node 1's replica kept
    # node 1 boots from its volume and rejoins; its replica is back online
    podman("start", stack.container("rabbitmq"))
    want = {f"rabbit@{n}" for n in NODES}
    stack.until("node 1 rejoined", lambda: stack.running_nodes("rabbitmq2") == want)
    stack.until(
        "3 replicas online",
        lambda: (qs := stack.request_queues("rabbitmq2")) and all(set(q["online"]) == want for q in qs),
    )
    _chat(stack)
