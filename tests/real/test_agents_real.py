"""The Responses API, the Anthropic Messages API and the OpenAI Agents SDK on the real SmolLM2-135M,
through a real `outpost serve` (the one the chat checks use, conftest.py): the checks the e2e tier
runs on the synthetic model (agent_checks.py) whose tool calls are forced (`required` / `any`), so
they hold on what a real small model writes: a tool call round trip on each API, and an agent run
with a tool and structured output."""

from __future__ import annotations

import pytest
from e2e import agent_checks as checks
from e2e.server_harness import Server

from outpost.models.catalog import SMOLLM2_135M_INDEX

pytestmark = pytest.mark.real

MODEL = SMOLLM2_135M_INDEX.filename.removesuffix(".gguf")  # the served id: the file's stem


@pytest.mark.parametrize(
    "check",
    [checks.responses_tools_then_output, checks.anthropic_tools, checks.agents_run],
    ids=lambda f: f.__name__,
)
def test_sdk_on_the_real_model(check, smollm2_server: Server) -> None:  # type: ignore[no-untyped-def]
    check(smollm2_server.url, MODEL)
