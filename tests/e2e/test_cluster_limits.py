"""The gateway answers a request too long for its workers exactly as `outpost serve` answers it.

Both run the same model file with `-np 4 -c 4096` (1,024 positions per request): serve as one
process, the gateway in front of one worker over a real rabbitmq-server. The worker's heartbeat
says its limit; the gateway's admission uses it, so an over-long prompt (or prompt + max_tokens)
is the same 400 with the same body, streamed or not, and /v1/models shows the same limit.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cluster_harness import Gateway, Proc, live, worker
from server_harness import Server
from server_harness import start as start_server

pytestmark = pytest.mark.cluster
LIMITS = ("-np", "4", "-c", "4096")
POSITIONS = 1024  # 4096 KV cells over 4 slots
TOKEN = 300  # any id of the tiny model's vocabulary


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("limits") / "limits-tiny.gguf"  # its own id, so its own queue
    shutil.copyfile(tiny_model, path)
    return path


@pytest.fixture(scope="module")
def both(rabbitmq: Any, model: Path) -> Iterator[tuple[Server, Gateway]]:
    serve = start_server(model, *LIMITS)
    gateway = Gateway(rabbitmq, [model])
    workers: list[Proc] = [worker(rabbitmq, model, *LIMITS)]
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        yield serve, gateway
    finally:
        for w in workers:
            w.stop()
        gateway.stop()
        serve.stop()


def _meta(url: str) -> dict[str, Any]:
    card = httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]
    return dict(card["meta"])


def test_models_show_the_workers_limit(both: tuple[Server, Gateway]) -> None:
    serve, gateway = both
    assert _meta(serve.url)["n_ctx_seq"] == POSITIONS
    assert _meta(gateway.url)["n_ctx_seq"] == POSITIONS  # not the trained context, not 8192
    (w,) = live(gateway.health())
    assert w["n_ctx_seq"] == POSITIONS and w["kv_cells"] >= 4096 and w["slots_total"] == 4
    assert len(w["chat_template"]) == 16


OVER_LONG = [
    # (id, path, body): the two cases, as token ids (exact lengths) and as chat
    ("prompt 2015 tokens", "/v1/completions", {"prompt": [TOKEN] * 2015, "max_tokens": 8}),
    ("prompt 920 + max_tokens 200", "/v1/completions", {"prompt": [TOKEN] * 920, "max_tokens": 200}),
    (
        "chat, long message",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello " * 1500}], "max_tokens": 8},
    ),
    (
        "chat, max_completion_tokens",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello " * 400}], "max_completion_tokens": 900},
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
@pytest.mark.parametrize(("path", "body"), [c[1:] for c in OVER_LONG], ids=[c[0] for c in OVER_LONG])
def test_over_long_request_is_answered_as_serve_does(
    both: tuple[Server, Gateway], path: str, body: dict[str, Any], stream: bool
) -> None:
    serve, gateway = both
    answers = []
    for url in (serve.url, gateway.url):
        r = httpx.post(f"{url}{path}", json={**body, "stream": stream}, timeout=60)
        answers.append((r.status_code, r.headers.get("content-type"), r.json()))
    assert answers[0][0] == 400, answers[0]
    assert answers[0][2]["error"]["code"] == "context_length_exceeded"
    assert str(POSITIONS) in answers[0][2]["error"]["message"]
    assert answers[1] == answers[0]


def test_a_request_that_fits_still_runs(both: tuple[Server, Gateway]) -> None:
    _, gateway = both
    body = {"prompt": [TOKEN] * 900, "max_tokens": 4, "ignore_eos": True}
    r = httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4
