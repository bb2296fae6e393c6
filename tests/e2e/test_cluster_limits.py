"""The gateway answers a request too long for its workers exactly as `outpost serve` answers it.

Both run the same model file with `-np 4 -c 4096` (1,024 positions per request): serve as one
process, the gateway in front of one worker over a real rabbitmq-server. The worker's heartbeat
says its limit; the gateway's admission uses it, so an over-long prompt (or prompt + max_tokens)
is the same 400 with the same body, streamed or not, and /v1/models shows the same limit.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
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


# 1,024 positions per request, under the model's trained 8,192. The plain weight layout keeps it so on
# every CPU: where AMX tiles fault, -np 2 would otherwise take AMX's one-token layout, whose one KV
# pool gives a request all 2,048 cells (outpost/engine/cpu_probe.py), and the prompt would fit.
LATE = ("-np", "2", "-c", "2048", "--repack", "off")
LATE_BODIES = {  # a prompt of ~1,500 tokens: the gateway (trained context) admits it, the worker cannot
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hello " * 1500}], "max_tokens": 8},
    "/v1/messages": {"messages": [{"role": "user", "content": "hello " * 1500}], "max_tokens": 8},
    "/v1/responses": {"input": "hello " * 1500, "max_output_tokens": 8},
}


def _late_error(path: str, r: httpx.Response, stream: bool) -> tuple[int, str, str, str]:
    """(status, the error's type or code, its message, its param or else its message) as each
    protocol frames it: the field to change is in `param` where the envelope has one."""
    if not stream:
        error = r.json()["error"]
    else:
        last = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")][-1]
        error = last["response"]["error"] if path == "/v1/responses" else last["error"]
    message = error["message"]
    return r.status_code, error.get("code") or error["type"], message, error.get("param") or message


def test_a_request_admitted_before_any_worker_was_live_is_refused_with_serves_400(
    rabbitmq: Any, tmp_path: Path, tiny_model: Path
) -> None:
    """The issue's report, as a new user met it: a gateway started, requests sent, then a worker with
    `-c 2048 -np 2` joined and took them. Each is the protocol's 400 (a stream: its error event after
    the 200), naming the protocol's field, never a 500."""
    model = tmp_path / "late-tiny.gguf"
    shutil.copyfile(tiny_model, model)
    gateway = Gateway(rabbitmq, [model])
    late: Proc | None = None
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and not live(h), "a gateway with no worker")
        cases = [(p, s) for p in LATE_BODIES for s in (False, True)]
        with ThreadPoolExecutor(len(cases)) as pool:
            sent = [
                pool.submit(
                    httpx.post, f"{gateway.url}{p}", json={**LATE_BODIES[p], "stream": s}, timeout=180
                )
                for p, s in cases
            ]
            gateway.wait_until(
                lambda h: int(h.get("queues", {}).get(model.stem) or 0) == len(cases), "all queued"
            )
            late = worker(rabbitmq, model, *LATE)
            replies = [f.result(timeout=240) for f in sent]
    finally:
        if late is not None:
            late.stop()
        gateway.stop()
    for (path, stream), r in zip(cases, replies, strict=True):
        status, kind, message, named = _late_error(path, r, stream)
        assert status == (200 if stream else 400), (path, stream, r.text[-500:])
        expected = "invalid_request_error" if path == "/v1/messages" else "context_length_exceeded"
        assert kind == expected, (path, stream, r.text[-500:])
        assert ("input" if path == "/v1/responses" else "messages") in named, (path, stream, named)
        assert "1024" in message, message
