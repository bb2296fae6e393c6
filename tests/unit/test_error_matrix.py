"""Every generating route, on serve and on a gateway, streamed and not, for each class of error: the
status, the protocol's own error envelope, and the protocol's own field names (issue 40).

Serve is the app over a `FakeBackend`; a gateway is the same app over a `RemoteBackend` whose worker
runs a cluster worker's request code over a `FakeBackend`, its messages crossing the wire's encoding
(error_matrix_harness.py). The classes: a bad field (400), a prompt too long for the context (400; on a
gateway also when it was admitted before any worker was live and refused by the smaller worker that took
it, which must read as the 400 a serve of that worker's context gives), an engine failure (500 in the
protocol's envelope; streamed: the protocol's error event after the headers), a client that goes away
(the engine sees the cancel and frees the slot; the access log says a cancel, not an error), and `n`
out of range.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from error_matrix_harness import (
    ROUTES,
    CrashingBackend,
    Reply,
    Route,
    call,
    data_lines,
    fim_ready,
    gateway_backend,
    request_body,
    sse_events,
)
from fake_backend import FakeBackend

from outpost.api.app import create_app
from outpost.settings import HttpSettings

SMALL = 64  # the context of the worker (or serve) that refuses
ANTHROPIC_TYPES = {400: "invalid_request_error", 413: "request_too_large", 500: "api_error"}
CASES = [pytest.param(r, s, id=f"{r.id}-{'stream' if s else 'whole'}") for r in ROUTES for s in (False, True)
         if r.streams or not s]  # fmt: skip
WHERE = ["serve", "gateway"]


def app_over(backend: Any, config: HttpSettings | None = None) -> Any:
    return create_app({"m": backend}, config or HttpSettings(), "m")


def serve(n_ctx_seq: int = 256, reply: str = "hello") -> tuple[Any, FakeBackend]:
    engine = fim_ready(FakeBackend(reply, n_ctx_seq=n_ctx_seq))
    return app_over(engine), engine


def gateway(worker_ctx: int = 256, live: bool = True, reply: str = "hello") -> tuple[Any, FakeBackend]:
    """(app, the worker's engine): a gateway app over one worker."""
    engine = fim_ready(FakeBackend(reply, n_ctx_seq=worker_ctx))
    remote, _ = gateway_backend(engine, live, n_ctx_train=256)
    return app_over(remote), engine


def over(where: str, **kw: Any) -> tuple[Any, FakeBackend]:
    return serve(**kw) if where == "serve" else gateway(**kw)


def post(app: Any, route: Route, body: dict[str, Any], **kw: Any) -> Reply:
    return asyncio.run(call(app, route.path, body, **kw))


def envelope(route: Route, obj: Any, status: int) -> tuple[str, str | None, str | None]:
    """(message, param, code) of an error reply body in `route`'s envelope; asserts its shape."""
    if route.envelope == "anthropic":
        assert set(obj) == {"type", "error"} and obj["type"] == "error", obj
        assert set(obj["error"]) == {"type", "message"}, obj
        assert obj["error"]["type"] == ANTHROPIC_TYPES[status], obj
        return obj["error"]["message"], None, None
    if route.envelope == "ollama":
        assert set(obj) == {"error"} and isinstance(obj["error"], str), obj
        return obj["error"], None, None
    assert set(obj) == {"error"}, obj  # OpenAI's (Responses' and llama-server's replies too)
    error = obj["error"]
    assert {"message", "type", "param", "code"} <= set(error), obj
    assert error["type"] == ("server_error" if status >= 500 else error["type"]), obj
    return error["message"], error["param"], error["code"]


def error_reply(route: Route, reply: Reply, status: int) -> tuple[str, str | None, str | None]:
    assert reply.status == status, (reply.status, reply.body)
    assert reply.content_type.startswith("application/json"), reply.headers
    return envelope(route, reply.json(), status)


def stream_error(route: Route, reply: Reply) -> Any:
    """The error a stream ended with, as its protocol frames it (after a 200)."""
    assert reply.status == 200, (reply.status, reply.body)
    text = reply.body.decode()
    if route.envelope == "ollama":
        assert reply.content_type.startswith("application/x-ndjson")
        return json.loads(text.splitlines()[-1])
    assert reply.content_type.startswith("text/event-stream"), reply.headers
    if route.envelope == "anthropic":
        name, data = sse_events(text)[-1]
        assert name == "error", text
        return data
    if route.envelope == "responses":
        name, data = sse_events(text)[-1]
        assert name == "response.failed" and data["type"] == name, text
        assert data["response"]["status"] == "failed", data
        return data["response"]["error"]
    lines = data_lines(text)
    if route.envelope == "openai":
        assert lines[-1] == "[DONE]", text
        lines = lines[:-1]
    else:
        assert "[DONE]" not in lines, text  # llama-server's native streams end without one
    return json.loads(lines[-1])


def names(route: Route, message: str, param: str | None, field: str) -> None:
    """The error names the protocol's own field: its `param` where its envelope has one, else its words."""
    if route.envelope in ("openai", "llama", "responses"):
        assert param is not None and param.split(".")[-1] == field, (param, field)
    else:
        assert field in message, (message, field)


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_a_bad_field_is_a_400_naming_it(route: Route, streamed: bool, where: str) -> None:
    app, engine = over(where)
    reply = post(app, route, request_body(route, "hi", "lots", streamed))
    message, param, _ = error_reply(route, reply, 400)
    names(route, message, param, route.budget)
    assert not engine.submitted


@pytest.mark.parametrize("too_long", ["prompt", "budget"])
@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_a_prompt_beyond_the_context_is_a_400_naming_the_field(
    route: Route, streamed: bool, where: str, too_long: str
) -> None:
    """A live worker's context is known to its gateway: refused before it is published, as serve does."""
    app, engine = over(where, **{"n_ctx_seq" if where == "serve" else "worker_ctx": SMALL})
    text, budget = ("x" * (SMALL + 16), 2) if too_long == "prompt" else ("x" * 8, SMALL * 2)
    reply = post(app, route, request_body(route, text, budget, streamed))
    message, param, code = error_reply(route, reply, 400)
    names(route, message, param, route.prompt if too_long == "prompt" else route.budget)
    assert str(SMALL) in message
    assert code in (None, "context_length_exceeded")
    assert not engine.submitted


@pytest.mark.parametrize("too_long", ["prompt", "budget"])
@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_a_worker_smaller_than_its_gateway_knew_refuses_with_serves_400(
    route: Route, streamed: bool, too_long: str
) -> None:
    """Admitted while no worker was live (the gateway knew only the trained context), then taken by a
    worker holding SMALL: the client hears what a serve of SMALL answers, in its protocol's shape (a
    stream: the same error in its error event, after the 200)."""
    text, budget = ("x" * (SMALL + 16), 2) if too_long == "prompt" else ("x" * 8, SMALL * 2)
    app, engine = gateway(worker_ctx=SMALL, live=False)
    raced = post(app, route, request_body(route, text, budget, streamed))
    direct = post(serve(n_ctx_seq=SMALL)[0], route, request_body(route, text, budget, False))
    error_reply(route, direct, 400)
    assert not engine.submitted and not engine.running  # the worker refused it before running it
    if not streamed:
        assert (raced.status, raced.json()) == (400, direct.json())
        return
    error = stream_error(route, raced)
    if route.envelope == "responses":  # its failure has a code and a message, the message naming the field
        said, field = direct.json()["error"]["message"], direct.json()["error"]["param"]
        assert error == {
            "code": "context_length_exceeded",
            "message": said if field in said else f"{field}: {said}",
        }
        assert field == (route.prompt if too_long == "prompt" else route.budget)
    else:
        assert error == direct.json()


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_an_engine_failure_is_a_500_in_the_protocols_envelope(
    route: Route, streamed: bool, where: str
) -> None:
    app, engine = over(where)
    engine.fail = "decode failed: the engine broke"
    reply = post(app, route, request_body(route, "hi", 4, streamed))
    if not streamed:
        message, _, _ = error_reply(route, reply, 500)
        assert "the engine broke" in message
        return
    error = stream_error(route, reply)
    if route.envelope == "responses":
        assert error["code"] in ("server_error", "engine_error") and "the engine broke" in error["message"]
        return
    message, _, _ = envelope(route, error, 500)
    assert "the engine broke" in message


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_a_client_that_goes_away_cancels_its_request_and_is_logged_as_a_cancel(
    route: Route, streamed: bool, where: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine holds the request (no token yet: a long prefill) when the client hangs up: after the
    headers of a stream, or while waiting for a whole reply."""
    app, engine = over(where)
    engine.pace.clear()

    def holding(reply: Reply) -> bool:
        return bool(engine.submitted) and (reply.started.is_set() or not streamed)

    with caplog.at_level(logging.INFO):
        post(app, route, request_body(route, "hi", 4, streamed), hang_up=holding)
        asyncio.run(asyncio.sleep(0))
    assert engine.started and set(engine.aborted) == set(engine.started), (engine.started, engine.aborted)
    assert engine.running == 0  # its slot is free
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "outpost.access"]
    assert [line["path"] for line in lines] == [route.path]
    assert lines[0]["cancelled"] is True, lines
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not errors, [r.getMessage() for r in errors]


N_ROUTES = [r for r in ROUTES if r.id in ("chat", "completions", "responses", "messages", "invocations-chat")]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("route", N_ROUTES, ids=[r.id for r in N_ROUTES])
def test_n_out_of_range_is_a_400(route: Route, where: str) -> None:
    app, engine = over(where)
    reply = post(app, route, {**route.body("hi", 4), "n": 1000000})
    message, param, _ = error_reply(route, reply, 400)
    assert param == "n" or "n=1000000" in message, (param, message)
    assert "1 to 16" in message or "1 output" in message
    assert not engine.submitted


@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_a_body_over_the_servers_limit_is_a_413_in_the_protocols_envelope(
    route: Route, streamed: bool
) -> None:
    """Refused by middleware before any route runs: still in the envelope of the API the path belongs to."""
    engine = FakeBackend()
    app = app_over(engine, HttpSettings(max_body=4096))
    reply = post(app, route, request_body(route, "x" * 8192, 4, streamed))
    message, _, _ = error_reply(route, reply, 413)
    assert "4096" in message
    assert not engine.submitted


@pytest.mark.parametrize(("route", "streamed"), CASES)
def test_an_engine_that_raises_is_a_500_in_the_protocols_envelope(
    route: Route, streamed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a failure the engine reports but one it raises: still the protocol's 500, logged as an error."""
    engine = fim_ready(CrashingBackend())
    with caplog.at_level(logging.ERROR):
        reply = post(app_over(engine), route, request_body(route, "hi", 4, streamed))
    if streamed:
        error = stream_error(route, reply)
        if route.envelope != "responses":
            envelope(route, error, 500)
    else:
        error_reply(route, reply, 500)
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
    assert engine.running == 0
