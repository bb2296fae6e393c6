"""/invocations' Content-Type and Accept handling (outpost/api/sagemaker/routes.py) through the whole app,
no model needed: JSON whatever the Content-Type says, as on every route; an Accept it cannot answer: 406."""

from __future__ import annotations

from typing import Any

import pytest
from fake_backend import FakeBackend
from fastapi import Body, Depends, FastAPI
from fastapi.testclient import TestClient

from outpost.api.app import create_app
from outpost.api.errors import install_error_handlers
from outpost.api.sagemaker import routes as sagemaker
from outpost.settings import HttpSettings


@pytest.fixture
def client() -> TestClient:
    """The whole app, middleware included (the body limit reads every body as JSON)."""
    return TestClient(create_app({"m": FakeBackend("hi")}, HttpSettings(), "m"))


@pytest.mark.parametrize(
    "ctype", ["text/plain", "application/x-www-form-urlencoded", "application/octet-stream"]
)
def test_a_json_body_is_read_whatever_its_content_type(client: TestClient, ctype: str) -> None:
    """`curl -d` (form encoding, as docs/serve.md shows) and clients that name another type."""
    r = client.post("/invocations", content=b'{"inputs": "hi"}', headers={"Content-Type": ctype})
    assert r.status_code == 200 and r.json() == [{"generated_text": "hi"}], r.text


def test_a_body_that_is_not_json_is_a_400_that_says_so(client: TestClient) -> None:
    r = client.post("/invocations", content=b"The sky is", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("accept", ["text/html", "application/xml, text/csv;q=0.5", "image/png"])
def test_an_accept_allowing_no_reply_is_406(client: TestClient, accept: str) -> None:
    r = client.post("/invocations", json={"inputs": "hi"}, headers={"Accept": accept})
    assert r.status_code == 406 and r.json()["error"]["code"] == "not_acceptable"


@pytest.mark.parametrize(
    "headers",
    [
        {"Content-Type": "application/json; charset=utf-8", "Accept": "application/json"},
        {"Content-Type": "application/json", "Accept": "text/event-stream"},
        {"Content-Type": "application/vnd.api+json", "Accept": "*/*"},
        {"Content-Type": "application/json", "Accept": "text/html, application/json;q=0.9"},
    ],
)
def test_json_in_json_or_sse_out_passes_negotiation(headers: dict[str, str]) -> None:
    # The same dependency in front of a route that echoes its body: no model needed.
    app = FastAPI()
    install_error_handlers(app)

    @app.post("/echo", dependencies=[Depends(sagemaker.negotiate)])
    async def echo(body: dict[str, Any] = Body(...)) -> dict[str, Any]:  # noqa: B008
        return body

    r = TestClient(app).post("/echo", content=b'{"inputs": "hi"}', headers=headers)
    assert r.status_code == 200 and r.json() == {"inputs": "hi"}, r.text
