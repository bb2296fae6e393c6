"""Several models through a gateway: one `outpost worker --models-dir` serves two GGUFs through serve's
model pool, a `outpost gateway --models-dir` (plus one `-m` no worker serves) lists and routes them.

Driven as a user would, over a real rabbitmq-server: /v1/models lists every model the gateway takes,
each card saying how many live workers serve it and hold it loaded (heartbeats); a chat request to
each model is answered by that model (its `model`, and the worker loads it on that first request;
with `--models-max 1` the other is unloaded for room, as /health's workers then say); a model the
gateway does not know is a 404 in OpenAI's shape naming the models it serves. Every wait is a
bounded poll of /health (readiness only); nothing depends on the machine's speed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import Gateway, Proc, live, worker
from server_harness import assert_openai_error

pytestmark = pytest.mark.cluster
ALPHA, BETA, IDLE = "pool-alpha", "pool-beta", "pool-idle"  # their own ids, so their own queues
HI = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def models_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from outpost.models import write_synthetic_model

    root = tmp_path_factory.mktemp("pool-models")
    shutil.copyfile(tiny_model, root / f"{ALPHA}.gguf")
    write_synthetic_model("tiny", root / f"{BETA}.gguf", quant="f16", seed=1)
    return root


@pytest.fixture(scope="module")
def idle_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model the gateway takes with -m and no worker serves."""
    path = tmp_path_factory.mktemp("pool-idle") / f"{IDLE}.gguf"
    shutil.copyfile(tiny_model, path)
    return path


def _loaded(health: dict[str, Any]) -> dict[str, bool]:
    return {w["model"]: w["loaded"] for w in live(health)}


@pytest.fixture(scope="module")
def cluster(rabbitmq: Any, models_dir: Path, idle_model: Path) -> Iterator[Gateway]:
    gateway = Gateway(rabbitmq, [idle_model], "--models-dir", str(models_dir), "--default-max-tokens", "4")
    args = ("--models-dir", str(models_dir), "--models-max", "1", "-np", "2", "-c", "1024")
    workers: list[Proc] = [worker(rabbitmq, None, *args, worker_id="pool-worker")]
    try:
        health = gateway.wait_until(
            lambda h: h.get("status") == "ok" and set(_loaded(h)) == {ALPHA, BETA}, "both models' heartbeats"
        )
        assert _loaded(health) == {ALPHA: False, BETA: False}  # loaded by their first request
        yield gateway
    finally:
        for w in workers:
            w.stop()
        gateway.stop()


def test_models_lists_every_model_with_the_workers_that_serve_it(cluster: Gateway) -> None:
    for path in ("/v1/models", "/models"):
        r = httpx.get(f"{cluster.url}{path}", timeout=10)
        assert r.status_code == 200, r.text
        cards = {card["id"]: card for card in r.json()["data"]}
        assert set(cards) == {IDLE, ALPHA, BETA}
        assert cards[ALPHA]["meta"]["workers"] == cards[BETA]["meta"]["workers"] == 1
        # Configured, no live worker: still listed (its requests wait in its queue for one).
        assert cards[IDLE]["meta"]["workers"] == 0
    workers = live(cluster.health())
    assert {w["id"] for w in workers} == {"pool-worker"}
    assert all(sorted(w["models"]) == [ALPHA, BETA] for w in workers)


def test_a_request_to_each_model_is_answered_by_it(cluster: Gateway) -> None:
    client = openai.OpenAI(base_url=f"{cluster.url}/v1", api_key="none", max_retries=0, timeout=120)
    for name, other in ((ALPHA, BETA), (BETA, ALPHA)):
        reply = client.chat.completions.create(model=name, messages=HI, max_tokens=4)  # type: ignore[arg-type]
        assert reply.model == name
        assert reply.choices[0].finish_reason in ("stop", "length")
        # --models-max 1: the model that answered is loaded, the other was unloaded for it.
        cluster.wait_until(lambda h, n=name, o=other: _loaded(h) == {n: True, o: False}, f"{name} loaded")


def test_an_unknown_model_is_a_404_naming_the_models_served(cluster: Gateway) -> None:
    r = httpx.post(
        f"{cluster.url}/v1/chat/completions",
        json={"model": "nope", "messages": HI, "max_tokens": 4},
        timeout=30,
    )
    err = assert_openai_error(r, 404, "model_not_found")
    assert err["param"] == "model"
    for name in (ALPHA, BETA, IDLE):
        assert repr(name) in err["message"], err
