"""`outpost serve -bs` (llama-server's bare --backend-sampling) against `--no-backend-sampling` on the
synthetic model, through the `openai` client: the ready line says which was chosen, greedy answers
are the same text, a seeded sampled answer repeats itself, and a JSON-schema request (a grammar: on
the host) is answered in the same server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from server_harness import Server, start

USER = [{"role": "user", "content": "Tell me about rivers."}]
SERVE = ("-np", "2", "-c", "2048")


@pytest.fixture(scope="module")
def in_graph(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, *SERVE, "-bs") as srv:
        yield srv


@pytest.fixture(scope="module")
def on_host(tiny_model: Path) -> Iterator[Server]:
    with start(tiny_model, *SERVE, "--no-backend-sampling") as srv:
        yield srv


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _answer(server: Server, **kwargs: object) -> str:
    r = _client(server).chat.completions.create(model="m", messages=USER, max_tokens=16, **kwargs)  # type: ignore[call-overload]
    return str(r.choices[0].message.content)


def test_the_ready_line_says_where_tokens_are_sampled(in_graph: Server, on_host: Server) -> None:
    assert "backend sampling on (asked)" in in_graph.ready_line()
    assert "backend sampling off (asked)" in on_host.ready_line()


def test_greedy_answers_are_the_same_text(in_graph: Server, on_host: Server) -> None:
    assert _answer(in_graph, temperature=0) == _answer(on_host, temperature=0)


def test_a_seeded_sampled_answer_repeats_itself(in_graph: Server) -> None:
    first = _answer(in_graph, temperature=1.5, seed=11)
    assert first and _answer(in_graph, temperature=1.5, seed=11) == first


def test_a_json_schema_answer_is_sampled_on_the_host_beside(in_graph: Server) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    r = _client(in_graph).chat.completions.create(
        model="m",
        messages=USER,
        max_tokens=32,
        temperature=1.0,
        response_format=fmt,  # type: ignore[arg-type]
    )
    assert isinstance(json.loads(str(r.choices[0].message.content))["ok"], bool)
