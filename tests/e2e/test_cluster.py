"""`outpost gateway` + two `outpost worker`s over a real rabbitmq-server, driven like a user would.

The workers pace their engine steps (OUTPOST_DEBUG_STEP_DELAY_MS) so that streams are still
running while a test kills or stops a worker, whatever the machine's speed; every wait polls
/health or the processes, bounded in time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import Gateway, Proc, live, worker
from server_harness import Server, anon_huge_pages_kb, assert_openai_error
from server_harness import start as start_server
from test_server_openai import BAD_INPUT, MAX_BODY

from outpost.engine.hugepages import environ_with_hugepages, glibc_version, thp_mode

pytestmark = pytest.mark.cluster
STEP_MS = 25  # paced steps: a 40-token stream lasts >= 1 s on any machine
PROMPT = "The quick brown fox"


def _model_copy(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The tiny model under another file name: another model id, so another queue."""
    path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
    shutil.copyfile(tiny_model, path)
    return path


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model_copy(tiny_model, tmp_path_factory, "cluster-tiny")


@pytest.fixture(scope="module")
def fleet(rabbitmq: Any, model: Path) -> Iterator[tuple[Gateway, list[Proc]]]:
    gateway = Gateway(rabbitmq, [model], "--max-body", str(MAX_BODY))  # serve suite's body limit
    workers = [worker(rabbitmq, model, "-np", "4", step_delay_ms=STEP_MS) for _ in range(2)]
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 2, "two live workers")
        yield gateway, workers
    finally:
        for w in workers:
            w.stop()
        gateway.stop()


def _complete(gateway: Gateway, max_tokens: int, stream: bool = False) -> Any:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=120)
    return client.completions.create(
        model=gateway_model(gateway),
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        stream=stream,
        extra_body={"ignore_eos": True},
        **({"stream_options": {"include_usage": True}} if stream else {}),
    )


def gateway_model(gateway: Gateway) -> str:
    data = httpx.get(f"{gateway.url}/v1/models", timeout=5).json()["data"]
    return str(data[0]["id"])


def _stream(
    gateway: Gateway, max_tokens: int, started: threading.Event | None = None
) -> tuple[str, int, int]:
    """(text, content chunks, usage completion tokens) of one streamed completion."""
    text, chunks, usage = "", 0, -1
    for chunk in _complete(gateway, max_tokens, stream=True):
        if chunk.choices and chunk.choices[0].text:
            text += chunk.choices[0].text
            chunks += 1
            if started is not None and chunks >= 3:
                started.set()
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return text, chunks, usage


def test_models_and_any_model_name(fleet: tuple[Gateway, list[Proc]], model: Path) -> None:
    """A gateway whose workers serve one model takes any name as it, as serve does (llama-server's
    rule); a gateway of several models still answers 404 (tests/unit/test_api_backend_seam.py)."""
    gateway, _ = fleet
    assert gateway_model(gateway) == model.stem
    r = httpx.post(
        f"{gateway.url}/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2}, timeout=30
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model.stem


def test_gateway_serves_the_chat_page(fleet: tuple[Gateway, list[Proc]]) -> None:
    from outpost.api import webui

    gateway, _ = fleet
    page = httpx.get(f"{gateway.url}/", timeout=30)
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert page.headers["content-security-policy"] == webui.CSP


@pytest.mark.skipif(
    environ_with_hugepages(dict(os.environ), thp_mode(), glibc_version()) is None,
    reason="only where THP is in madvise mode and glibc has the hugetlb tunable (else nothing to do)",
)
def test_workers_run_on_huge_pages_as_serve_does(fleet: tuple[Gateway, list[Proc]]) -> None:
    """A worker re-executes itself onto huge pages like `outpost serve` (without them its prefill
    ran ~4% slower than serve's on the same core: benchmark (a) read it as the gateway's overhead)."""
    _, workers = fleet
    for w in workers:
        environ = Path(f"/proc/{w.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"GLIBC_TUNABLES=glibc.malloc.hugetlb=1" in environ
        assert anon_huge_pages_kb(w.proc.pid) >= 2048


@pytest.mark.parametrize(
    ("path", "body", "status", "code"), [c[1:] for c in BAD_INPUT], ids=[c[0] for c in BAD_INPUT]
)
def test_bad_input_as_on_serve(
    fleet: tuple[Gateway, list[Proc]], path: str, body: Any, status: int, code: str | None
) -> None:
    """`outpost serve`'s bad-input cases, against the gateway: the same statuses and codes."""
    gateway, _ = fleet
    with httpx.Client(base_url=gateway.url, timeout=60) as http:
        if isinstance(body, bytes):
            r = http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            r = http.post(path, json=body)
    assert_openai_error(r, status, code)


def test_api_keys_as_on_serve(
    rabbitmq: Any, fleet: tuple[Gateway, list[Proc]], model: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text("# gateway keys\nsk-cluster-test\n")
    gateway = Gateway(rabbitmq, [model], "--api-key-file", str(keys))
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and bool(live(h)), "ready")  # /health is open
        body = {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}
        with httpx.Client(base_url=gateway.url, timeout=60) as c:
            assert_openai_error(c.post("/v1/completions", json=body), 401, "invalid_api_key")
            wrong = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-nope"})
            assert_openai_error(wrong, 401, "invalid_api_key")
            good = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer sk-cluster-test"})
            assert good.status_code == 200, good.text
            assert good.json()["usage"]["completion_tokens"] == 4
        assert "sk-cluster-test" not in gateway.stderr()
    finally:
        gateway.stop()


@pytest.fixture(scope="module")
def serve(model: Path) -> Iterator[Server]:
    """`outpost serve` on the same model file: what the gateway must answer like."""
    server = start_server(model, "-c", "4096")
    try:
        yield server
    finally:
        server.stop()


def test_embeddings_as_on_serve(fleet: tuple[Gateway, list[Proc]], serve: Server) -> None:
    gateway, _ = fleet
    texts = ["a red apple", "a green pear", "naïve café ☕"]

    def embed(url: str) -> Any:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        return client.embeddings.create(model=gateway_model(gateway), input=texts)  # base64 on the wire

    remote, local = embed(gateway.url), embed(serve.url)
    assert [d.index for d in remote.data] == [0, 1, 2]
    assert remote.model == local.model == gateway_model(gateway)
    for a, b in zip(remote.data, local.data, strict=True):
        assert len(a.embedding) == len(b.embedding) > 0
        assert a.embedding == pytest.approx(b.embedding, abs=1e-5)
    assert remote.usage.prompt_tokens == local.usage.prompt_tokens > 0
    assert remote.usage.total_tokens == local.usage.total_tokens
    body = {"input": "a red apple", "encoding_format": "float"}
    floats = httpx.post(f"{gateway.url}/v1/embeddings", json=body, timeout=120).json()
    assert floats["data"][0]["embedding"] == pytest.approx(local.data[0].embedding, abs=1e-5)


def test_worker_embedding_model_as_on_serve(
    rabbitmq: Any,
    fleet: tuple[Gateway, list[Proc]],
    tiny_model: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """`outpost worker --embedding-model E` embeds its model's jobs with E, as `outpost serve
    --embedding-model E` does: the same vectors, and not the served model's. (A gateway shows and
    routes to the workers of its own models only: the fleet's never lists this one.)"""
    from outpost.models import write_synthetic_model

    served = _model_copy(tiny_model, tmp_path_factory, "cluster-embed")
    other = write_synthetic_model("tiny", tmp_path_factory.mktemp("embedder") / "embedder.gguf", seed=7)
    texts = ["a red apple", "a green pear"]
    gateway = Gateway(rabbitmq, [served])
    w = worker(rabbitmq, served, "-np", "2", "--embedding-model", str(other))
    local = start_server(served, "-c", "4096", "--embedding-model", str(other))
    plain = start_server(served, "-c", "4096")
    try:
        gateway.wait_until(lambda h: len(live(h, "cluster-embed")) == 1, "the embedding worker")
        assert [w["model"] for w in live(gateway.health())] == ["cluster-embed"]
        assert {w["model"] for w in live(fleet[0].health())} <= {gateway_model(fleet[0])}

        def embed(url: str) -> list[list[float]]:
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
            reply = client.embeddings.create(model="cluster-embed", input=texts)
            return [d.embedding for d in reply.data]

        remote, expected, served_own = embed(gateway.url), embed(local.url), embed(plain.url)
        for a, b in zip(remote, expected, strict=True):
            assert a == pytest.approx(b, abs=1e-5)
        assert remote[0] != pytest.approx(served_own[0], abs=1e-3)  # E's vectors, not the served model's
    finally:
        for proc in (w, gateway):
            proc.stop()
        local.stop()
        plain.stop()


@pytest.mark.parametrize(
    "body",
    # ["ok", 5] is one input of text and a token id on serve now (llama-server's reading); 5.5 is
    # neither text nor a token id anywhere
    [{"input": "apple " * 3000}, {"input": []}, {"input": ["ok", 5.5]}],
    ids=["longer than the embedding context", "empty list", "neither text nor a token id"],
)
def test_bad_embeddings_body_as_on_serve(
    fleet: tuple[Gateway, list[Proc]], serve: Server, body: dict[str, Any]
) -> None:
    gateway, _ = fleet
    remote = httpx.post(f"{gateway.url}/v1/embeddings", json=body, timeout=120)
    local = httpx.post(f"{serve.url}/v1/embeddings", json=body, timeout=120)
    err = assert_openai_error(remote, local.status_code)
    assert local.status_code == 400
    assert err == local.json()["error"]  # message, type, param and code


def test_embeddings_under_any_model_name_as_on_serve(
    fleet: tuple[Gateway, list[Proc]], serve: Server, model: Path
) -> None:
    gateway, _ = fleet
    body = {"input": "x", "model": "text-embedding-3-small"}
    for url in (gateway.url, serve.url):
        r = httpx.post(f"{url}/v1/embeddings", json=body, timeout=120)
        assert r.status_code == 200 and r.json()["model"] == model.stem, (url, r.text)


def test_24_concurrent_requests_use_both_workers(fleet: tuple[Gateway, list[Proc]]) -> None:
    gateway, _ = fleet
    before = {w["id"]: w["requests_done"] for w in live(gateway.health())}
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda _: _complete(gateway, 16), range(24)))
    for r in results:
        assert r.usage.completion_tokens == 16
        assert r.choices[0].finish_reason == "length"

    def done_since(h: dict[str, Any]) -> dict[str, int]:  # the workers seen before and now
        return {w["id"]: w["requests_done"] - before[w["id"]] for w in live(h) if w["id"] in before}

    after = gateway.wait_until(lambda h: sum(done_since(h).values()) >= 24, "24 requests counted")
    done = done_since(after)
    assert len(done) == 2 and all(n > 0 for n in done.values()), done


def test_worker_sigkill_mid_stream_is_invisible(
    rabbitmq: Any, fleet: tuple[Gateway, list[Proc]], model: Path
) -> None:
    gateway, workers = fleet
    # >= 3 s per stream at STEP_MS: the kill lands while they run even when the busy worker is
    # read from a heartbeat a second or two old (two suites on two shared cores made 40 too few).
    n_tokens = 120
    reference = _complete(gateway, n_tokens).choices[0].text
    started = [threading.Event() for _ in range(6)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_stream, gateway, n_tokens, ev) for ev in started]
        for ev in started:
            assert ev.wait(120), "a stream did not start"
        health = gateway.wait_until(lambda h: any(w["slots_busy"] > 0 for w in live(h)), "a busy worker")
        busy = max(live(health), key=lambda w: w["slots_busy"])
        victim = next(w for w in workers if f"-{w.proc.pid}-" in busy["id"])
        victim.proc.kill()  # SIGKILL: no drain, its requests unacked
        victim.proc.wait(10)
        workers.remove(victim)
        workers.append(worker(rabbitmq, model, "-np", "4", step_delay_ms=STEP_MS))  # for later tests
        results = [f.result(timeout=180) for f in futures]
    for text, chunks, usage in results:
        assert usage == n_tokens
        assert text == reference  # nothing repeated, nothing missing
        assert chunks <= n_tokens
    health = gateway.wait_until(lambda h: len(live(h)) == 2, "a replacement worker")
    assert health.get("resumes", 0) >= 1
    assert _metric(gateway, "outpost_cluster_resumes_total") >= 1
    assert _metric(gateway, "outpost_cluster_workers") == 2
    assert _metric(gateway, "outpost_cluster_broker_connected") == 1


def _metric(gateway: Gateway, name: str) -> float:
    """The sum of every sample of `name` on the gateway's /metrics."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    samples = [line for line in text.splitlines() if line.split("{")[0].split(" ")[0] == name]
    assert samples, f"{name} not on /metrics"
    return sum(float(line.rsplit(" ", 1)[1]) for line in samples)


def test_worker_sigterm_drains(rabbitmq: Any, fleet: tuple[Gateway, list[Proc]]) -> None:
    gateway, workers = fleet
    started = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_stream, gateway, 40, started)
        assert started.wait(120)

        # Only this fleet's running workers: a worker SIGKILLed by an earlier test still shows in
        # /health, busy, until its heartbeat ages out.
        def busy_here(h: dict[str, Any]) -> list[Proc]:
            ids = [w["id"] for w in live(h) if w["slots_busy"] > 0]
            return [p for p in workers if p.proc.poll() is None and any(f"-{p.proc.pid}-" in i for i in ids)]

        health = gateway.wait_until(lambda h: bool(busy_here(h)), "a busy worker of this fleet")
        victim = busy_here(health)[0]
        victim.signal(signal.SIGTERM)
        text, _, usage = future.result(timeout=180)
    assert usage == 40 and text
    assert victim.wait(60) == 0
    workers.remove(victim)


def test_queue_full_429_and_expired_504(
    rabbitmq: Any, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A model with no live worker: requests wait in its queue; past the limit 429; past the deadline 504."""
    lonely = _model_copy(tiny_model, tmp_path_factory, "cluster-lonely")
    gateway = Gateway(rabbitmq, [lonely], "--max-queue", "2", "--request-timeout", "10")
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok", "ready")
        body = {"model": lonely.stem, "prompt": "x", "max_tokens": 4}

        def post() -> httpx.Response:
            return httpx.post(f"{gateway.url}/v1/completions", json=body, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            waiting = [pool.submit(post) for _ in range(2)]
            depth = gateway.wait_until(lambda h: _depth(h, lonely.stem) == 2, "two queued", 30)
            # A quorum queue takes one message past its limit, and RabbitMQ applies a policy to a
            # queue asynchronously: send one more at a time until one is refused, each either
            # answered (a 429 comes back at once) or seen waiting in the queue, never timed.
            rejected = None
            for _ in range(6):
                extra = pool.submit(post)
                seen = _depth(depth, lonely.stem)
                depth = gateway.wait_until(
                    lambda h, seen=seen, f=extra: f.done() or _depth(h, lonely.stem) > seen,
                    "answer or queued",
                    30,
                )
                if extra.done() or _depth(depth, lonely.stem) <= seen:
                    rejected = extra.result(timeout=60)
                    break
            assert rejected is not None, "six requests past --max-queue 2 were all queued"
            assert rejected.headers["retry-after"].isdigit()
            assert_openai_error(rejected, 429)
            for f in waiting:
                assert_openai_error(f.result(timeout=60), 504)  # expired in the queue: no worker
    finally:
        gateway.stop()


def _depth(health: dict[str, Any], model: str) -> int:
    return int(health.get("queues", {}).get(model) or 0)


def _busy(health: dict[str, Any]) -> int:
    return sum(w["slots_busy"] for w in live(health))


def test_client_disconnect_frees_the_slot(fleet: tuple[Gateway, list[Proc]]) -> None:
    gateway, _ = fleet
    gateway.wait_until(lambda h: _busy(h) == 0, "idle workers", 60)
    body = {
        "model": gateway_model(gateway),
        "prompt": PROMPT,
        "max_tokens": 1000,
        "stream": True,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()  # not left by `break`: closing the generator would close the response
        for _ in range(5):
            next(lines)
        gateway.wait_until(lambda h: _busy(h) == 1, "the stream's slot busy", 30)
    gateway.wait_until(lambda h: _busy(h) == 0, "the slot freed after the disconnect", 30)


def test_gateway_sigkill_frees_the_workers_slots(
    rabbitmq: Any, fleet: tuple[Gateway, list[Proc]], model: Path
) -> None:
    gateway, _ = fleet
    gateway.wait_until(lambda h: _busy(h) == 0, "idle workers", 60)
    other = Gateway(rabbitmq, [model])
    try:
        other.wait_until(lambda h: h.get("status") == "ok" and bool(live(h)), "a second gateway")
        started = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(_stream, other, 1000, started)
            assert started.wait(120)
            gateway.wait_until(lambda h: _busy(h) == 1, "the stream's slot busy", 30)
            other.proc.kill()  # its reply queue expires 20 s later: replies become unroutable
            gateway.wait_until(lambda h: _busy(h) == 0, "the slot freed after the gateway died", 30)
            with contextlib.suppress(Exception):
                future.result(timeout=30)
    finally:
        other.stop()


def test_gateway_sigterm_drains(rabbitmq: Any, fleet: tuple[Gateway, list[Proc]], model: Path) -> None:
    """Like `outpost serve`: new requests 503, the stream in flight completes, exit 0."""
    other = Gateway(rabbitmq, [model])
    try:
        other.wait_until(lambda h: h.get("status") == "ok" and bool(live(h)), "a second gateway")
        started = threading.Event()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(_stream, other, 40, started)
            assert started.wait(120)
            other.signal(signal.SIGTERM)
            other.wait_until(lambda h: h.get("status") == "draining", "draining", 30)
            text, _, usage = future.result(timeout=120)
        assert usage == 40 and text
        assert other.wait(60) == 0
    finally:
        other.stop()


def test_broker_restart_recovers(rabbitmq: Any, fleet: tuple[Gateway, list[Proc]]) -> None:
    """Last in this module: while the broker is down new requests get 503 at once; then all recovers."""
    gateway, _ = fleet
    rabbitmq.stop()
    try:
        gateway.wait_until(lambda h: h.get("broker") == "unreachable", "the broker seen down", 60)
        t0 = time.monotonic()
        r = httpx.post(
            f"{gateway.url}/v1/completions",
            json={"model": gateway_model(gateway), "prompt": "x", "max_tokens": 2},
            timeout=30,
        )
        assert time.monotonic() - t0 < 10  # at once, not a hang
        assert_openai_error(r, 503)
        assert r.headers["retry-after"].isdigit()
    finally:
        rabbitmq.start()
    gateway.wait_until(lambda h: h.get("broker") == "connected" and len(live(h)) >= 1, "reconnected", 180)
    result = _complete(gateway, 8)
    assert result.usage.completion_tokens == 8
