"""The Responses API, the Anthropic Messages API and the OpenAI Agents SDK through `outpost gateway`
+ an `outpost worker` over a real rabbitmq-server: the same checks as on `outpost serve`
(agent_checks.py), and what `previous_response_id` does when the follow-up reaches another gateway."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agent_checks as checks
import openai
import pytest
from cluster_harness import Gateway, Proc, live, worker

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("agents") / "agents-tiny.gguf"  # its own model id: its own queue
    shutil.copyfile(tiny_model, path)
    return path


@pytest.fixture(scope="module")
def gateways(rabbitmq: Any, model: Path) -> Iterator[list[Gateway]]:
    """Two gateways (as behind a load balancer) and one worker."""
    pair = [Gateway(rabbitmq, [model], "--default-max-tokens", "16") for _ in range(2)]
    workers: list[Proc] = [worker(rabbitmq, model, "-np", "2", "-c", "4096")]
    try:
        for g in pair:
            g.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        yield pair
    finally:
        for p in [*workers, *pair]:
            p.stop()


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
def test_sdk_through_the_gateway(check, gateways: list[Gateway], model: Path) -> None:  # type: ignore[no-untyped-def]
    check(gateways[0].url, model.stem)


def test_previous_response_on_another_gateway_is_a_clear_400(gateways: list[Gateway], model: Path) -> None:
    first, other = (checks.openai_client(g.url) for g in gateways)
    r = first.responses.create(model=model.stem, input="hi", max_output_tokens=4)
    assert first.responses.create(
        model=model.stem, input="more", previous_response_id=r.id, max_output_tokens=4
    )
    with pytest.raises(openai.BadRequestError) as caught:
        other.responses.create(model=model.stem, input="more", previous_response_id=r.id, max_output_tokens=4)
    assert r.id in str(caught.value) and caught.value.code == "previous_response_not_found"
    assert "gateway" in str(caught.value)
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(r.id)
