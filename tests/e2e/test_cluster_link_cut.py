"""A worker's and a gateway's link to the broker cut (no TCP reset) while streams are in flight.

Each process runs in a network namespace of its own (a "host"), joined to this one by a veth pair;
the broker listens on this side's address of each pair too (OUTPOST_BROKER_LISTEN). Bringing the
pair down drops every packet, so neither end hears anything: the cut is noticed only through the
AMQP heartbeat (2 s: within 10 s, docs/cluster.md). The link stays down for CUT_S, then comes back;
every stream in flight completes, token-exact: the worker (tests/e2e/counting_worker.py) answers
with FakeBackend.counting, token i of a request being its position p, sent as the text "<p>", so
a client must receive exactly "<P><P+1>...<P+N-1>" (P: the prompt's tokens) whatever the resumes.
The gateway's clients reach it over a second pair that stays up. The namespaces are the fault
matrix's (benchmarks/harness/netns.py, shared with `python -m benchmarks.cluster`'s link-cut scenarios).

The worker paces its tokens (0.1 s each), so a stream outlasts the cut whatever the machine's
speed; every wait is bounded. Skipped, with the reason, unless root with `ip netns`.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import Proc, live
from server_harness import OUTPOST, free_port

from benchmarks.harness.broker import Broker
from benchmarks.harness.netns import Host, Link, unavailable

pytestmark = [pytest.mark.cluster, pytest.mark.broker]
WHY_NOT = unavailable()
if WHY_NOT:
    pytestmark.append(pytest.mark.skip(reason=f"cut links need network namespaces: {WHY_NOT}"))

COUNTING_WORKER = Path(__file__).with_name("counting_worker.py")
ROOT = Path(__file__).resolve().parents[2]
STEP_S = 0.1
N_TOKENS = 300  # 30 s of paced tokens: in flight across the whole cut
STREAMS = 2
CUT_S = 15.0  # longer than the heartbeat's 10 s: both ends give the connection up
DETECT_S = 10.0  # the documented bound for noticing a cut link
LOST = "lost the broker"
REQUEST_TIMEOUT_S = 150  # the gateway's: a stream (30 s) and the cut (15 s) end well within it


@dataclass
class Net:
    worker_host: Host
    gateway_host: Host
    worker_link: Link
    gateway_link: Link  # the gateway's way to the broker
    client_link: Link  # the clients' way to the gateway: never cut


@pytest.fixture(scope="module")
def net() -> Iterator[Net]:
    tag = f"{os.getpid() % 100000}"
    third = 100 + os.getpid() % 150
    hosts: list[Host] = []
    try:
        w, g = Host(f"outpost-w{tag}"), Host(f"outpost-g{tag}")
        hosts += [w, g]
        yield Net(
            w,
            g,
            w.link(f"opw{tag}", f"10.213.{third}.0"),
            g.link(f"opg{tag}", f"10.213.{third}.4"),
            g.link(f"opc{tag}", f"10.213.{third}.8"),
        )
    finally:
        for host in hosts:
            host.remove()


@pytest.fixture(scope="module")
def broker(net: Net, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    own = Broker(tmp_path_factory.mktemp("rabbitmq-link-cut"))
    own.env["OUTPOST_BROKER_LISTEN"] = f"{net.worker_link.host_addr} {net.gateway_link.host_addr}"
    own.start()
    try:
        yield own
    finally:
        own.stop()


class Fleet:
    def __init__(self, net: Net, broker: Broker, model: Path) -> None:
        self.net, self.model_id = net, model.stem
        password = ["--broker-password-file", str(broker.password_file)]
        env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        worker_cmd = [sys.executable, str(COUNTING_WORKER), *password, "--model-id", model.stem]
        worker_cmd += ["--broker", f"amqp://outpost@{net.worker_link.host_addr}:{broker.amqp_port}/"]
        worker_cmd += ["--slots", str(STREAMS), "--step-s", str(STEP_S)]
        self.worker = Proc(net.worker_host.argv(worker_cmd), env)
        port = free_port()
        self.url = f"http://{net.client_link.ns_addr}:{port}"
        gateway_cmd = [*OUTPOST, "gateway", *password, "-m", str(model), "--broker-outage", "120"]
        gateway_cmd += ["--request-timeout", str(REQUEST_TIMEOUT_S)]
        gateway_cmd += ["--broker", f"amqp://outpost@{net.gateway_link.host_addr}:{broker.amqp_port}/"]
        gateway_cmd += ["--host", net.client_link.ns_addr, "--port", str(port)]
        self.gateway = Proc(net.gateway_host.argv(gateway_cmd), env)

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/health", timeout=5).json()
        return body

    def wait_until(self, cond: Any, what: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline, last = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            for p in (self.worker, self.gateway):
                assert p.proc.poll() is None, f"exited {p.proc.returncode}:\n{p.stderr()}"
            try:
                last = self.health()
                if cond(last):
                    return last
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(
            f"no {what} in {timeout} s: {last}\n{self.gateway.stderr()}\n{self.worker.stderr()}"
        )

    def stop(self) -> None:
        self.worker.stop()
        self.gateway.stop()


@pytest.fixture(scope="module")
def fleet(
    net: Net, broker: Broker, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    model = tmp_path_factory.mktemp("link-cut") / "link-cut.gguf"
    shutil.copyfile(tiny_model, model)
    made = Fleet(net, broker, model)
    try:
        made.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        yield made
    finally:
        made.stop()


def _stream(fleet: Fleet, started: threading.Event, read_timeout: float) -> tuple[str, int, str]:
    """(text, prompt tokens, finish reason) of one streamed completion; `started` after 3 chunks."""
    client = openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="none", max_retries=0, timeout=read_timeout)
    text, chunks, prompt, finish = "", 0, -1, ""
    for chunk in client.completions.create(
        model=fleet.model_id,
        prompt="The quick brown fox jumps over the lazy dog",
        max_tokens=N_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.choices:
            text += chunk.choices[0].text or ""
            chunks += 1
            if chunks >= 3:
                started.set()
            finish = str(chunk.choices[0].finish_reason or finish)
        if chunk.usage is not None:
            prompt = chunk.usage.prompt_tokens
            assert chunk.usage.completion_tokens == N_TOKENS
    return text, prompt, finish


def _lost_after(proc: Proc, before: int, since: float, limit: float) -> float:
    """Seconds from `since` until `proc` logs its (before + 1)-th lost connection (polled)."""
    deadline = since + limit
    while time.monotonic() < deadline:
        if proc.stderr().count(LOST) > before:
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError(f"no '{LOST}' within {limit} s of the cut:\n{proc.stderr()[-3000:]}")


def _cut_with_streams_in_flight(fleet: Fleet, link: Link, proc: Proc, read_timeout: float = 600) -> float:
    """STREAMS streams; the link cut for CUT_S once they run; returns the detection time."""
    started = [threading.Event() for _ in range(STREAMS)]
    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(_stream, fleet, ev, read_timeout) for ev in started]
        for ev in started:
            assert ev.wait(120), "a stream did not start"
        before = proc.stderr().count(LOST)
        cut_at = time.monotonic()
        link.down()
        try:
            detected = _lost_after(proc, before, cut_at, CUT_S)
            time.sleep(
                max(0.0, cut_at + CUT_S - time.monotonic())
            )  # the outage itself, not a wait on the engine
        finally:
            link.up()
        results = [f.result(timeout=600) for f in futures]
    for text, prompt, finish in results:
        assert finish == "length"
        want = "".join(f"<{p}>" for p in range(prompt, prompt + N_TOKENS))
        assert text == want, _first_difference(text, want)  # no token repeated, skipped or changed
    return detected


def _first_difference(got: str, want: str) -> str:
    i = next((k for k, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    return f"first difference at char {i} of {len(want)}: got {got[i : i + 20]!r}, want {want[i : i + 20]!r}"


def test_a_workers_link_cut_for_15_s_loses_no_token(fleet: Fleet, net: Net) -> None:
    detected = _cut_with_streams_in_flight(fleet, net.worker_link, fleet.worker)
    assert detected <= DETECT_S + 1.0, detected  # + the log poll and a loaded machine's scheduling
    fleet.wait_until(lambda h: len(live(h)) == 1, "the worker back")
    assert "consuming" in fleet.worker.stderr().rsplit(LOST, 1)[1]  # it reconnected and consumed again


def test_a_gateways_link_cut_for_15_s_loses_no_token(fleet: Fleet, net: Net) -> None:
    before = fleet.wait_until(lambda h: h.get("broker") == "connected", "connected")
    detected = _cut_with_streams_in_flight(fleet, net.gateway_link, fleet.gateway)
    assert detected <= DETECT_S + 1.0, detected
    health = fleet.wait_until(lambda h: h.get("broker") == "connected" and len(live(h)) == 1, "reconnected")
    # Its reply queue outlived the cut: the worker replied into it all along and the gateway read on
    # where it stopped. Nothing was lost, so nothing was sent again and no stream changed worker.
    assert (health["resumes"], health["resubmitted"]) == (before["resumes"], before["resubmitted"]), (
        [line for line in fleet.gateway.stderr().splitlines() if "outpost.cluster" in line][-20:],
        fleet.worker.stderr()[-2000:],
    )
    assert "resubmitting" not in fleet.gateway.stderr(), fleet.gateway.stderr()[-2000:]
    assert "cannot be reached" not in fleet.worker.stderr(), fleet.worker.stderr()[-2000:]
