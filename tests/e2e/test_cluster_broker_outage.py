"""`outpost gateway` + `outpost worker -np 4` processes across their broker's restart and kill -9.

A broker of this module's own (the session's stays up for the other tests). The worker paces its
steps (OUTPOST_DEBUG_STEP_DELAY_MS), so a 200-token stream lasts >= 40 s whatever the machine's
speed and is certainly in flight when the broker goes; /health is polled throughout for the
worker's busy slots. Every wait is bounded.
"""

from __future__ import annotations

import concurrent.futures
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from cluster_harness import Gateway, Proc, live, worker

from benchmarks.harness.broker import Broker

pytestmark = pytest.mark.cluster
STEP_MS = 200
SLOTS = 4
N_TOKENS = 200


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with Broker(tmp_path_factory.mktemp("rabbitmq-e2e-faults")).booted() as own:
        yield own


@pytest.fixture(scope="module")
def fleet(broker: Broker, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    model = tmp_path_factory.mktemp("faults") / "cluster-faults.gguf"
    shutil.copyfile(tiny_model, model)
    # A restart here (two CLI runs and a boot on a loaded machine) may outlast the default 30 s.
    gateway = Gateway(broker, [model], "--broker-outage", "600")
    workers: list[Proc] = [worker(broker, model, "-np", str(SLOTS), step_delay_ms=STEP_MS)]
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        yield gateway
    finally:
        for w in workers:
            w.stop()
        gateway.stop()


def _client(gateway: Gateway) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=400)


def _ask(
    gateway: Gateway, stream: bool, started: threading.Event | None = None
) -> tuple[int, str, str | None]:
    """(completion tokens, finish reason, error) of one completion; the error of a failed one."""
    client = _client(gateway)
    model = client.models.list().data[0].id
    args: dict[str, Any] = {"model": model, "prompt": "The quick brown fox", "max_tokens": N_TOKENS}
    args.update(temperature=0, extra_body={"ignore_eos": True})
    try:
        if not stream:
            r = client.completions.create(**args)
            return r.usage.completion_tokens, str(r.choices[0].finish_reason), None
        chunks, usage, finish = 0, -1, ""
        for chunk in client.completions.create(**args, stream=True, stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].text:
                chunks += 1
                if started is not None and chunks >= 3:
                    started.set()
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = str(chunk.choices[0].finish_reason)
            if chunk.usage is not None:
                usage = chunk.usage.completion_tokens
        return usage, finish, None
    except openai.APIError as exc:
        return -1, "error", str(exc)


class BusyWatch:
    """Polls the gateway's /health for the worker's busy slots until stopped; keeps the most seen."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway, self.most, self._stop = gateway, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.most = max([self.most] + [w["slots_busy"] for w in live(self.gateway.health())])
            except Exception:  # the gateway may be busy; the next poll counts
                continue

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.most


def _in_flight_across(gateway: Gateway, break_broker: Any) -> list[tuple[int, str, str | None]]:
    """4 streams running and 2 plain requests queued behind them; `break_broker()` while they run."""
    watch = BusyWatch(gateway)
    started = [threading.Event() for _ in range(SLOTS)]
    with concurrent.futures.ThreadPoolExecutor(SLOTS + 2) as pool:
        futures = [pool.submit(_ask, gateway, True, ev) for ev in started]
        for ev in started:
            assert ev.wait(180), "a stream did not start"
        futures += [pool.submit(_ask, gateway, False) for _ in range(2)]
        gateway.wait_until(
            lambda h: int(h.get("queues", {}).get("cluster-faults") or 0) == 2, "two queued", 60
        )
        break_broker()
        results = [f.result(timeout=600) for f in futures]
    # Its credits hold at most SLOTS; the resume queue up to SLOTS more, only streams that lost
    # their worker (docs/DESIGN.md, "Interrupted first"), so a kill -9 may show 5 or 6 held.
    assert watch.stop() <= 2 * SLOTS
    return results


def test_broker_restart_with_requests_in_flight_loses_nothing(broker: Broker, fleet: Gateway) -> None:
    def restart() -> None:
        broker.stop()
        broker.start()

    results = _in_flight_across(fleet, restart)
    assert results == [(N_TOKENS, "length", None)] * (SLOTS + 2), results
    fleet.wait_until(lambda h: h.get("broker") == "connected" and h.get("resumes", 0) >= SLOTS, "resumes", 60)


def test_broker_kill9_every_request_ends(broker: Broker, fleet: Gateway) -> None:
    def kill() -> None:
        broker.kill9()
        broker.start()

    fleet.wait_until(lambda h: h.get("broker") == "connected" and len(live(h)) == 1, "the worker back", 180)
    for tokens, finish, error in _in_flight_across(fleet, kill):
        assert (tokens, finish) == (N_TOKENS, "length") or error, (tokens, finish, error)
