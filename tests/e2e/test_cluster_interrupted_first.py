"""Overcommitted, a worker SIGKILLed mid-stream: nothing lost, nothing repeated, interrupted first.

A gateway and one worker A (`-np 2`) on the tiny model; two streamed chat completions take A's two
slots and four more wait in the model's queue (prompts this short go to the shared queue, never a
lane: gateway/routing.py). A is SIGKILLed while its two streams are mid-way; only then does worker B
(`-np 2`) start. The broker returns A's two unacked requests to the front of the quorum queue
(tests/integration/test_cluster_requeue_order.py), so B's two credits take them first, ask their
gateway what the client has and continue from there (worker/resume.py); a waiting request can only
be delivered to B once one of them has ended and been acked (a credit holds one unacked request).

Nothing here is timed to race: A paces its steps slowly (SLOW_MS), so a stream of N_TOKENS lasts
far longer on A than the waits before the kill, and the test checks that it was still running when
killed (the client's count, then both resumes in B's log and on the gateway); B paces its steps
(FAST_MS), so a request's first token comes at least one paced step after the request it waited
for ended. Every wait is bounded.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
from cluster_harness import Gateway, Proc, live, worker

pytestmark = pytest.mark.cluster
N_TOKENS = 48
SLOW_MS = 250  # A: 48 tokens take >= 12 s there; the kill comes after the client saw 3
FAST_MS = 40  # B: a stream >= 2 s; a waiting request's first token >= 40 ms after its turn came
SEEN_BEFORE_KILL = 3
MESSAGES = [{"role": "user", "content": "The quick brown fox"}]
WAIT_S = 120.0


@dataclass
class Stream:
    """One streamed chat completion, as its client saw it (time.monotonic per content chunk)."""

    accepted: threading.Event = field(default_factory=threading.Event)
    seen: threading.Event = field(default_factory=threading.Event)  # SEEN_BEFORE_KILL chunks in
    text: str = ""
    times: list[float] = field(default_factory=list)
    finishes: list[str] = field(default_factory=list)
    usage: int = -1


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model under a name of its own: its own queues, apart from the other cluster tests'."""
    path = tmp_path_factory.mktemp("interrupted-first") / "interrupted-first.gguf"
    shutil.copyfile(tiny_model, path)
    return path


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    try:
        yield started
    finally:
        for p in reversed(started):
            p.stop()


def _client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=WAIT_S)


def _args(model: Path) -> dict[str, Any]:
    return {
        "model": model.stem,
        "messages": MESSAGES,
        "max_tokens": N_TOKENS,
        "temperature": 0,
        "extra_body": {"ignore_eos": True},
    }


def _run(gateway: Gateway, model: Path, s: Stream) -> None:
    chunks = _client(gateway).chat.completions.create(
        **_args(model), stream=True, stream_options={"include_usage": True}
    )
    s.accepted.set()  # the gateway answered 200 and its headers (openai raises on anything else)
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            s.text += chunk.choices[0].delta.content
            s.times.append(time.monotonic())
            if len(s.times) >= SEEN_BEFORE_KILL:
                s.seen.set()
        if chunk.choices and chunk.choices[0].finish_reason is not None:
            s.finishes.append(chunk.choices[0].finish_reason)
        if chunk.usage is not None:
            s.usage = chunk.usage.completion_tokens


def _wait(ev: threading.Event, what: str, procs: list[Proc]) -> None:
    if not ev.wait(WAIT_S):
        logs = "\n".join(p.stderr()[-4000:] for p in procs)
        raise AssertionError(f"no {what} within {WAIT_S} s\n{logs}")


def test_sigkilled_worker_streams_resume_before_the_queued_ones(
    rabbitmq: Any, model: Path, procs: list[Proc]
) -> None:
    gateway = Gateway(rabbitmq, [model])
    procs.append(gateway)
    a = worker(rabbitmq, model, "-np", "2", step_delay_ms=SLOW_MS)
    procs.append(a)
    gateway.wait_until(lambda h: len(live(h, model.stem)) == 1, "worker A live")
    resumes_before = gateway.health().get("resumes", 0)

    running, queued = [Stream(), Stream()], [Stream() for _ in range(4)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(_run, gateway, model, s) for s in running]
        for s in running:
            _wait(s.seen, f"{SEEN_BEFORE_KILL} tokens of a running stream", procs)
        futures += [pool.submit(_run, gateway, model, s) for s in queued]
        for s in queued:
            _wait(s.accepted, "200 for a queued stream", procs)
        # A's two slots and its two credits are taken: the four wait in the broker's queue.
        gateway.wait_until(lambda h: h.get("queues", {}).get(model.stem) == 4, "four queued", 60)
        assert all(not s.times for s in queued), "a queued request started on A's two slots"
        seen = [len(s.times) for s in running]
        assert all(n < N_TOKENS for n in seen), f"a stream ended before the kill: {seen}"
        a.proc.kill()  # SIGKILL: no drain; its two requests go back to the broker unacked
        a.proc.wait(10)
        killed_at = time.monotonic()
        b = worker(rabbitmq, model, "-np", "2", step_delay_ms=FAST_MS)  # only now: after the kill
        procs.append(b)
        for f in futures:
            f.result(timeout=WAIT_S * 2)

    # The same request unstreamed, on B alone (greedy: every stream's text must be this one).
    reference = _client(gateway).chat.completions.create(**_args(model))
    assert reference.usage is not None and reference.usage.completion_tokens == N_TOKENS
    expected = reference.choices[0].message.content
    assert expected
    logs = f"worker B:\n{b.stderr()[-6000:]}\ngateway:\n{gateway.stderr()[-6000:]}"
    for s in running + queued:
        assert s.usage == N_TOKENS, (s.usage, logs)  # all of them, on the gateway's count
        assert s.text == expected, (s.text, expected, logs)  # token-exact: nothing missing or repeated
        assert s.finishes == ["length"], (s.finishes, logs)
        assert len(s.times) <= N_TOKENS
    # Both were still running when A died, and were resumed on B from what their clients had.
    assert b.stderr().count("resuming ") == 2, logs
    health = gateway.wait_until(lambda h: h.get("resumes", 0) >= resumes_before + 2, "two resumes", 30)
    assert health["resumes"] == resumes_before + 2, (health, logs)
    for s in running:
        assert any(t < killed_at for t in s.times) and any(t > killed_at for t in s.times)
    # Interrupted first: no queued request started before an interrupted one continued after the
    # kill; and B holds two requests at a time, the two interrupted ones first, so the k-th queued
    # request to start (from 0) started only after k + 1 requests had ended.
    continued = min(min(t for t in s.times if t > killed_at) for s in running)
    starts = sorted(s.times[0] for s in queued)
    ends = sorted(s.times[-1] for s in running + queued)
    assert starts[0] > continued, (starts, continued, killed_at)
    for k, start in enumerate(starts):
        assert start > ends[k], (k, starts, ends, killed_at)
