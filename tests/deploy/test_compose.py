"""deploy/compose.yaml brought up with podman-compose: RabbitMQ, the shared model volume, a gateway and
two workers; a chat completion through the gateway; then `down -v`. Real podman, real HTTP.

No registry and no model hub are reachable here, so tests/deploy/compose/compose.test.yaml swaps in
a RabbitMQ stand-in built from Debian's rabbitmq-server (rabbitmq.Containerfile, same Debian base as
the image) and a synthetic `tiny` model written into the shared volume by `model-init` instead of a
pull; everything else is deploy/compose.yaml's own.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from podman_harness import (
    COMPOSE_DIR,
    FIGURES,
    ROOT,
    ComposeProject,
    free_ports,
    live_workers,
    podman,
    podman_env,
)

pytestmark = pytest.mark.deploy
COMPOSE = [ROOT / "deploy" / "compose.yaml", COMPOSE_DIR / "compose.test.yaml"]
# Bounds, not expectations: the stack is up in well under a minute on an idle 2-core machine.
UP_LIMIT_S = 600
READY_LIMIT_S = 300


class Stack(ComposeProject):
    def __init__(self, image: str, rabbitmq_image: str, tmp: Path) -> None:
        self.api_key = secrets.token_hex(16)
        (tmp / "broker_password").write_text(secrets.token_hex(16))
        (tmp / "api_keys").write_text(self.api_key + "\n")
        amqp, dist, mgmt, epmd, gateway = free_ports(5)
        self.url = f"http://127.0.0.1:{gateway}"
        env = {
            **podman_env(),
            "OUTPOST_IMAGE": image,
            "OUTPOST_MODEL": "/models/tiny.gguf",
            "OUTPOST_WORKER_SLOTS": "2",
            "OUTPOST_GATEWAY_PORT": str(gateway),  # discarded under host networking; kept consistent
            "OUTPOST_TEST_RABBITMQ_IMAGE": rabbitmq_image,
            "OUTPOST_TEST_SECRETS": str(tmp),
            "OUTPOST_TEST_AMQP_PORT": str(amqp),
            "OUTPOST_TEST_DIST_PORT": str(dist),
            "OUTPOST_TEST_MGMT_PORT": str(mgmt),
            "OUTPOST_TEST_EPMD_PORT": str(epmd),
            "OUTPOST_TEST_GATEWAY_PORT": str(gateway),
        }
        super().__init__(f"outpost-test-{os.getpid()}", COMPOSE, env)


@pytest.fixture(scope="module")
def stack(image: str, rabbitmq_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("compose-secrets")
    tmp.chmod(0o755)
    s = Stack(image, rabbitmq_image, tmp)
    for f in tmp.iterdir():
        f.chmod(0o644)  # secrets are bind-mounted; the containers' users read them
    started = time.monotonic()
    try:
        up = s.compose("up", "-d", timeout=UP_LIMIT_S)
        assert up.returncode == 0, up.stderr[-4000:]
        # podman 4.3 keeps no `service_healthy` order (podman-compose says so): the workers and the
        # gateway retry the broker until it is up; the wait is on what a user sees, /health.
        s.wait_live_workers(s.url, 2, READY_LIMIT_S)
        FIGURES["compose stack (up -d -> gateway /health with 2 live workers)"] = (
            f"{time.monotonic() - started:.1f} s"
        )
        yield s
    finally:
        s.down()


def test_compose_stack_answers_a_chat_completion_through_the_gateway(stack: Stack) -> None:
    auth = {"Authorization": f"Bearer {stack.api_key}"}
    models = httpx.get(stack.url + "/v1/models", headers=auth, timeout=30)
    assert models.status_code == 200, models.text
    model = models.json()["data"][0]["id"]
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "temperature": 0,
    }
    # The API keys came from the secret file: no key, no answer.
    refused = httpx.post(stack.url + "/v1/chat/completions", json=body, timeout=30)
    assert refused.status_code == 401, refused.text
    r = httpx.post(stack.url + "/v1/chat/completions", json=body, headers=auth, timeout=120)
    assert r.status_code == 200, r.text + stack.logs()
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == model
    choice = out["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] in ("stop", "length")
    assert 1 <= out["usage"]["completion_tokens"] <= 8
    # Served by one of the two workers, which read the model only from the shared volume (their
    # heartbeats carry the count: polled, bounded).
    deadline = time.monotonic() + 60
    while True:
        health = httpx.get(stack.url + "/health", timeout=10).json()
        if sum(w["requests_done"] for w in live_workers(health)) >= 1:
            break
        assert time.monotonic() < deadline, health
        time.sleep(0.5)
    init = podman(
        "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}",
        f"{stack.project}_model-init_1",
    )  # fmt: skip
    assert init.stdout.split() == ["exited", "0", "0"], init.stdout
