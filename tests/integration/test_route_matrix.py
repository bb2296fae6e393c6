"""Every generating route, on `outpost serve`'s API and on a gateway's, streamed and not, against each
error class: the status, the protocol's own envelope and the field names it knows.

The API is served over real HTTP by uvicorn (on a loop of its own, in a thread) over the one fake
backend (tests/fake_backend.py): directly, as `outpost serve` puts a LocalBackend under it, or as a
gateway's `RemoteBackend` with a `Worker` on the fake across a real broker. Between cases the test
reconfigures the fake: `fail` (an engine failure), `worker_n_ctx_seq` (a worker whose context turns
out smaller than the 256 positions it advertised: it refuses after admission, as one that joined
after the gateway's check does) and `pace` (held: the request is running when the client leaves).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fake_backend import FakeBackend, FakeCodec

from benchmarks.harness.ports import free_port
from outpost.api.app import create_app
from outpost.cluster.gateway.link import GatewayLink
from outpost.cluster.gateway.remote import RemoteBackend
from outpost.cluster.worker.service import Worker
from outpost.settings import HttpSettings

N_CTX = 256  # what the fake (and so each worker's heartbeat) says one request may hold
SMALL_CTX = 64  # what a racing worker really holds
MAX_BODY = 16384


@dataclass(frozen=True)
class Route:
    name: str
    path: str
    body: Callable[[str, int], dict[str, Any]]  # (prompt text, output budget) -> the request body
    prompt: str  # what the protocol calls the prompt, and the output budget (its errors name them)
    budget: str
    bad: dict[str, Any]  # fields that make the body wrong, and the field the 400 names
    bad_param: str
    style: str = "openai"  # envelope and stream: openai, native, responses, anthropic, ollama
    streams: bool = True


def _chat(p: str, n: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": p}], "max_tokens": n}


ROUTES = [
    Route("chat", "/v1/chat/completions", _chat, "messages", "max_tokens", {"n": 1000000}, "n"),
    Route(
        "completions",
        "/v1/completions",
        lambda p, n: {"prompt": p, "max_tokens": n},
        "prompt",
        "max_tokens",
        {"n": 1000000},
        "n",
    ),
    Route(
        "responses",
        "/v1/responses",
        lambda p, n: {"input": p, "max_output_tokens": n},
        "input",
        "max_output_tokens",
        {"n": 1000000},
        "n",
        style="responses",
    ),
    Route(
        "messages", "/v1/messages", _chat, "messages", "max_tokens", {"n": 1000000}, "n", style="anthropic"
    ),
    Route(
        "completion",
        "/completion",
        lambda p, n: {"prompt": p, "n_predict": n},
        "prompt",
        "n_predict",
        {"n_predict": "many"},
        "n_predict",
        style="native",
    ),
    Route(
        "tgi",
        "/invocations",
        lambda p, n: {"inputs": p, "parameters": {"max_new_tokens": n}},
        "inputs",
        "max_new_tokens",
        {"parameters": {"max_new_tokens": "many"}},
        "parameters.max_new_tokens",
        streams=False,  # SageMaker's /invocations answers whole; TGI's streaming is another route
    ),
    Route(
        "ollama",
        "/api/chat",
        lambda p, n: {
            "model": "m",
            "messages": [{"role": "user", "content": p}],
            "options": {"num_predict": n},
            "stream": False,  # Ollama streams by default
        },
        "messages",
        "num_predict",
        {"options": {"temperature": -1}},
        "options.temperature",
        style="ollama",
    ),
]
CASES = [
    pytest.param(r, s, id=f"{r.name}-{'stream' if s else 'whole'}")
    for r in ROUTES
    for s in (0, 1)
    if s <= r.streams
]
SITES = ["serve", pytest.param("gateway", marks=pytest.mark.cluster)]
ANTHROPIC_TYPES = {400: "invalid_request_error", 500: "api_error"}


@dataclass
class Site:
    url: str
    fake: FakeBackend
    loop: asyncio.AbstractEventLoop
    log: list[dict[str, Any]] = field(default_factory=list)  # the access log lines, as JSON

    def hold(self, held: bool) -> None:
        """Holds (or releases) every stream before its first token, on the server's loop."""
        self.loop.call_soon_threadsafe(self.fake.pace.clear if held else self.fake.pace.set)


@contextlib.contextmanager
def served(
    setup: Callable[[], Awaitable[tuple[Any, Callable[[], Awaitable[None]]]]],
) -> Iterator[tuple[str, Any]]:
    """uvicorn serving what `setup` builds (on the server's own loop); yields (base URL, loop)."""
    loop = asyncio.new_event_loop()
    port = free_port()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def main() -> None:
        try:
            app, cleanup = await setup()
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on")
            server = holder["server"] = uvicorn.Server(config)
            task = asyncio.ensure_future(server.serve())
            while not server.started and not task.done():
                await asyncio.sleep(0.01)
        finally:
            ready.set()
        await task
        await cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(120) and "server" in holder, "the server did not start"
    try:
        yield f"http://127.0.0.1:{port}", loop
    finally:
        loop.call_soon_threadsafe(setattr, holder["server"], "should_exit", True)
        thread.join(60)


class _AccessLines(logging.Handler):
    def __init__(self, lines: list[dict[str, Any]]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))


@contextlib.contextmanager
def access_log(site: Site) -> Iterator[None]:
    logger = logging.getLogger("outpost.access")
    handler, level = _AccessLines(site.log), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _settings() -> HttpSettings:
    return HttpSettings(max_body=MAX_BODY, webui=False)


@pytest.fixture(scope="module")
def serve_site() -> Iterator[Site]:
    fake = FakeBackend("hello", n_ctx_seq=N_CTX)

    async def setup() -> tuple[Any, Callable[[], Awaitable[None]]]:
        async def nothing() -> None:
            return None

        return create_app({"m": fake}, _settings(), "m"), nothing

    with served(setup) as (url, loop):
        site = Site(url, fake, loop)
        with access_log(site):
            yield site


@pytest.fixture(scope="module")
def gateway_site(rabbitmq: Any) -> Iterator[Site]:
    fake = FakeBackend("hello", n_ctx_seq=N_CTX)
    model = "matrix-" + uuid.uuid4().hex[:8]

    async def setup() -> tuple[Any, Callable[[], Awaitable[None]]]:
        link = GatewayLink(rabbitmq.url, [model])
        await link.start()
        stop = asyncio.Event()
        worker = asyncio.ensure_future(Worker(rabbitmq.url, model, fake).run(stop))
        backend = RemoteBackend(link, model, FakeCodec(), None, request_timeout=60.0)  # type: ignore[arg-type]
        for _ in range(3000):  # a worker's first heartbeat: bounded at 30 s
            if link.live_workers(model) and backend.n_ctx_seq == N_CTX:
                break
            await asyncio.sleep(0.01)
        assert backend.n_ctx_seq == N_CTX, "the worker never became live"

        async def cleanup() -> None:
            stop.set()
            await asyncio.wait({worker}, timeout=30)
            await link.close()

        return create_app({model: backend}, _settings(), model), cleanup

    with served(setup) as (url, loop):
        site = Site(url, fake, loop)
        with access_log(site):
            yield site


@pytest.fixture()
def site(request: pytest.FixtureRequest) -> Iterator[Site]:
    chosen: Site = request.getfixturevalue(f"{request.param}_site")
    yield chosen
    chosen.fake.fail, chosen.fake.worker_n_ctx_seq = None, None
    chosen.hold(False)


def post(site: Site, route: Route, body: dict[str, Any], stream: bool) -> httpx.Response:
    body = {**body, "stream": True} if stream else body
    return httpx.post(site.url + route.path, json=body, timeout=60)


def sse_events(text: str) -> list[tuple[str | None, Any]]:
    """(event name, data) per event; data is JSON, or the string "[DONE]"."""
    events = []
    for block in text.split("\n\n"):
        name = next((ln[7:] for ln in block.splitlines() if ln.startswith("event: ")), None)
        data = next((ln[6:] for ln in block.splitlines() if ln.startswith("data: ")), None)
        if data is not None:
            events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


def expect_reply_error(
    route: Route, reply: httpx.Response, status: int, param: str | None, code: str | None
) -> None:
    """The error as an HTTP status, in the protocol's envelope."""
    assert reply.status_code == status, reply.text
    body = reply.json()
    if route.style == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == ANTHROPIC_TYPES[status]
        return
    if route.style == "ollama":  # {"error": "..."}: the field is named in the message, if anywhere
        assert list(body) == ["error"] and isinstance(body["error"], str), body
        if param is not None and code is None:
            assert param in body["error"], body
        return
    error = body["error"]
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error


def expect_stream_error(
    route: Route, reply: httpx.Response, status: int, param: str | None, code: str
) -> None:
    """The error after a 200: the event each protocol ends a failed stream with."""
    assert reply.status_code == 200, reply.text
    if route.style == "ollama":  # NDJSON: a failed stream's last line is {"error": "..."}
        last = json.loads(reply.text.strip().splitlines()[-1])
        assert list(last) == ["error"], last
        return
    events = sse_events(reply.text)
    if route.style == "anthropic":
        name, data = events[-1]
        assert name == "error" and data["error"]["type"] == ANTHROPIC_TYPES[status], events[-1]
        return
    if route.style == "responses":
        name, data = events[-1]
        assert name == "response.failed" and data["response"]["error"]["code"] == code, events[-1]
        return
    datas = [d for _, d in events if d != "[DONE]"]
    error = datas[-1]["error"]
    assert (error["code"], error["param"]) == (code, param), error
    if route.style == "openai":
        assert events[-1][1] == "[DONE]"


@pytest.mark.parametrize("site", SITES, indirect=True)
@pytest.mark.parametrize(("route", "stream"), CASES)
def test_a_bad_field_is_a_400_naming_it(site: Site, route: Route, stream: int) -> None:
    reply = post(site, route, {**route.body("hi", 2), **route.bad}, bool(stream))
    expect_reply_error(route, reply, 400, route.bad_param, None)
    if route.style == "anthropic":
        assert "n=1000000" in reply.json()["error"]["message"]
    assert not site.fake.running


@pytest.mark.parametrize("site", SITES, indirect=True)
@pytest.mark.parametrize(("route", "stream"), CASES)
@pytest.mark.parametrize("over", ["prompt", "budget"])
def test_an_over_long_request_is_a_400_naming_the_field_to_change(
    site: Site, route: Route, stream: int, over: str
) -> None:
    body = route.body("x" * 300, 2) if over == "prompt" else route.body("x" * 100, 200)
    submitted = len(site.fake.submitted)
    reply = post(site, route, body, bool(stream))
    field_name = route.prompt if over == "prompt" else route.budget
    expect_reply_error(route, reply, 400, field_name, "context_length_exceeded")
    if route.style == "anthropic" and over == "budget":
        assert "lower max_tokens" in reply.json()["error"]["message"]
    assert len(site.fake.submitted) == submitted  # refused before it reached the backend


@pytest.mark.parametrize("site", SITES, indirect=True)
@pytest.mark.parametrize(("route", "stream"), CASES)
def test_a_refusal_after_admission_is_the_same_400(site: Site, route: Route, stream: int) -> None:
    """A worker that holds less than it advertised refuses the admitted request: serve's 400, or
    (the 200 already sent) the stream's error event, never a 500."""
    site.fake.worker_n_ctx_seq = SMALL_CTX
    reply = post(site, route, route.body("x" * 80, 2), bool(stream))
    if stream:
        expect_stream_error(route, reply, 400, route.prompt, "context_length_exceeded")
    else:
        expect_reply_error(route, reply, 400, route.prompt, "context_length_exceeded")
        if route.style not in ("anthropic", "ollama"):
            assert reply.json()["error"]["n_ctx"] == SMALL_CTX


@pytest.mark.parametrize("site", SITES, indirect=True)
@pytest.mark.parametrize(("route", "stream"), CASES)
def test_an_engine_failure_is_a_500_in_the_protocol_s_envelope(site: Site, route: Route, stream: int) -> None:
    site.fake.fail = "the engine broke"
    reply = post(site, route, route.body("hi", 2), bool(stream))
    if stream:
        expect_stream_error(route, reply, 500, None, "engine_error")
    else:
        expect_reply_error(route, reply, 500, None, "engine_error")
    assert "the engine broke" in reply.text


async def _until(cond: Callable[[], bool], what: str) -> None:
    for _ in range(3000):  # bounded: 30 s
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def _leave_while_running(site: Site, route: Route, stream: bool) -> None:
    fake, aborted = site.fake, len(site.fake.aborted)
    body = {**route.body("hi", 2), **({"stream": True} if stream else {})}
    async with httpx.AsyncClient(timeout=60) as client:
        task = asyncio.ensure_future(client.post(site.url + route.path, json=body))
        await _until(lambda: fake.running == 1, "the request running")
        task.cancel()  # the client goes away: its connection closes
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await _until(lambda: len(fake.aborted) > aborted, "the request aborted")
    site.hold(False)  # the engine's next step: a request aborted meanwhile ends there (a worker's)
    await _until(lambda: fake.running == 0, "its slot freed")


@pytest.mark.parametrize("site", SITES, indirect=True)
@pytest.mark.parametrize(("route", "stream"), CASES)
def test_a_client_going_away_cancels_its_request(
    site: Site, route: Route, stream: int, caplog: pytest.LogCaptureFixture
) -> None:
    site.hold(True)
    lines = len(site.log)
    with caplog.at_level(logging.ERROR, logger="outpost"):
        asyncio.run(_leave_while_running(site, route, bool(stream)))
        asyncio.run(_until_logged(site, lines, route.path))
    mine = [ln for ln in site.log[lines:] if ln["path"] == route.path]
    assert mine[-1].get("cancelled") is True, mine
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.records


async def _until_logged(site: Site, since: int, path: str) -> None:
    await _until(lambda: any(ln["path"] == path for ln in site.log[since:]), "the access log line")


@pytest.mark.parametrize("site", ["serve"], indirect=True)
def test_a_body_over_the_limit_on_messages_is_anthropic_s_413(site: Site) -> None:
    route = ROUTES[3]
    reply = post(site, route, route.body("x" * (MAX_BODY + 1), 2), False)
    assert reply.status_code == 413
    assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == "request_too_large"
