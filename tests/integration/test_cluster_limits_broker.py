"""Workers' real limits over a real broker: heartbeats carry them, the gateway admits by the smallest,
and a worker that refuses a request as too long answers with serve's words, never a 500.

The workers run on the one fake backend (tests/fake_backend.py) with a chosen `n_ctx_seq`.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from fake_backend import FakeBackend
from test_cluster_broker import _model, cluster, collect, run, until

from outpost.cluster.heartbeat import template_hash
from outpost.messages import FinishReason, GenerateRequest, context_exceeded

pytestmark = pytest.mark.cluster


def test_heartbeats_carry_the_limits_and_the_gateway_takes_the_smallest(rabbitmq: Any) -> None:
    small, large = FakeBackend.counting(slots=2, n_ctx_seq=64), FakeBackend.counting(slots=3, n_ctx_seq=128)

    async def main() -> None:
        model = _model()
        async with cluster(rabbitmq, model, [small, large]) as (backend, workers):
            await until(lambda: backend.link.n_ctx_seq(model) is not None, "limits in the heartbeats")
            assert backend.n_ctx_seq == 64
            seen = {w["slots_total"]: w for w in backend.link.live_workers(model)}
            assert seen[2]["n_ctx_seq"] == 64 and seen[3]["n_ctx_seq"] == 128
            assert seen[2]["kv_cells"] == small.kv_cells
            assert seen[2]["chat_template"] == template_hash("fake") != ""
            workers[0][1].set()  # the small worker drains: the others' limit is what holds
            await until(lambda: backend.n_ctx_seq == 128, "the draining worker left out")

    run(main())


@pytest.mark.parametrize(("n_prompt", "max_tokens", "param"), [(60, 10, "max_tokens"), (70, 5, "messages")])
def test_a_worker_refuses_an_over_long_request_with_serve_s_words(
    rabbitmq: Any, n_prompt: int, max_tokens: int, param: str
) -> None:
    """Published anyway (a gateway that had not seen this worker): the one final event carries the
    refusal the API turns into serve's 400, and the request is acked, not redelivered."""
    engine = FakeBackend.counting(slots=1, n_ctx_seq=64)

    async def main() -> None:
        async with cluster(rabbitmq, _model(), [engine]) as (backend, workers):
            deadline = time.monotonic() + 60
            over = GenerateRequest(list(range(100, 100 + n_prompt)), max_tokens, deadline=deadline)
            events = await collect(await backend.submit(over))
            expected = context_exceeded(n_prompt, max_tokens, 64)
            assert expected is not None and expected.param == param
            assert len(events) == 1 and events[0].finish_reason is FinishReason.ERROR
            assert (events[0].error, events[0].error_param) == (str(expected), param)
            fits = GenerateRequest([1, 2, 3], 5, deadline=deadline)
            ran = await collect(await backend.submit(fits))
            assert [t for e in ran for t in e.token_ids] == [3, 4, 5, 6, 7]
            await until(lambda: workers[0][0].completed == 2, "both acked")
            assert engine.started == [fits.request_id]

    run(main())
