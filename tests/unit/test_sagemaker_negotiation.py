"""/invocations' Content-Type and Accept handling (outpost/api/sagemaker/routes.py), no model needed: the
checks answer before the body reaches the engine."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import Body, Depends, FastAPI
from fastapi.testclient import TestClient

from outpost.api.errors import install_error_handlers
from outpost.api.sagemaker import routes as sagemaker


@pytest.fixture
def client() -> TestClient:
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(sagemaker.router)
    return TestClient(app)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", "text/csv"])
def test_a_body_that_is_not_json_is_415(client: TestClient, ctype: str) -> None:
    r = client.post("/invocations", content=b'{"inputs": "hi"}', headers={"Content-Type": ctype})
    assert r.status_code == 415
    assert r.json()["error"]["code"] == "unsupported_media_type" and ctype in r.json()["error"]["message"]


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
