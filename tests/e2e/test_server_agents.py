"""The Responses API, the Anthropic Messages API and the OpenAI Agents SDK against a real
`outpost serve` on the synthetic model, driven by the real `openai`, `anthropic` and
`openai-agents` packages (the checks are in agent_checks.py; the gateway runs the same)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import agent_checks as checks
import anthropic
import httpx
import openai
import pytest
from server_harness import Server, start

MODEL = "tiny-f16"
KEY = "sk-agents-e2e"


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, "-np", "2", "-c", "4096", "--default-max-tokens", "16") as srv:
        yield srv


@pytest.mark.parametrize(
    "check",
    [
        checks.responses_create_and_stream,
        checks.responses_tools_then_output,
        checks.responses_json_schema,
        checks.responses_errors,
        checks.anthropic_create_stream_count,
        checks.anthropic_stop_reasons,
        checks.anthropic_tools,
        checks.anthropic_errors,
        checks.agents_run,
    ],
    ids=lambda f: f.__name__,
)
def test_sdk(check, server: Server) -> None:  # type: ignore[no-untyped-def]
    check(server.url, MODEL)


def test_keys_version_header_and_a_store_of_one(tiny_model: Path) -> None:
    with start(tiny_model, "-np", "1", "-c", "1024", "--api-key", KEY, "--responses-max", "1") as srv:
        responses = checks.openai_client(srv.url, KEY).responses
        first = responses.create(model=MODEL, input="hi", max_output_tokens=2)
        second = responses.create(model=MODEL, input="hi", max_output_tokens=2)
        assert responses.retrieve(second.id).id == second.id
        with pytest.raises(openai.BadRequestError, match=first.id):  # --responses-max 1: evicted
            responses.create(model=MODEL, input="more", previous_response_id=first.id, max_output_tokens=2)
        try:
            checks.anthropic_client(srv.url, "sk-wrong").messages.create(
                model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
            )
            raise AssertionError("a wrong key was accepted")
        except anthropic.AuthenticationError as exc:
            assert exc.body == {
                "type": "error",
                "error": {"type": "authentication_error", "message": exc.body["error"]["message"]},
            }  # type: ignore[index]
        msg = checks.anthropic_client(srv.url, KEY).messages.create(  # x-api-key + anthropic-version
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
        assert msg.usage.output_tokens <= 2
        r = httpx.post(
            f"{srv.url}/v1/messages",
            headers={"x-api-key": KEY, "anthropic-version": "1999-01-01"},
            content=b"{not json",
            timeout=30,
        )
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
