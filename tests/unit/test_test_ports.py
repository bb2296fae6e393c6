"""benchmarks/harness/ports.py picks loopback ports the kernel never hands to an outgoing connection."""

from __future__ import annotations

import socket

import pytest

import benchmarks.harness.ports as ports_module
from benchmarks.harness.ports import LOWEST, bind_all, ephemeral_range, free_port_runs, free_ports


def test_free_ports_are_distinct_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    ports = free_ports(12)
    assert len(set(ports)) == 12
    assert all(p >= LOWEST for p in ports) and set(ports) <= set(ports_module.candidate_ports())
    if high - low < 40000:  # Linux's default range: the candidates are all outside it
        assert not any(low <= p <= high for p in ports)
    bind_all(ports)


def test_a_bound_port_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    others = free_ports(199)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        mine = int(held.getsockname()[1])
        # A quarter of each call's sample is `mine`'s place: it is tried in nearly every run.
        monkeypatch.setattr(ports_module, "candidate_ports", lambda: [mine, *others])
        picked = [p for _ in range(20) for p in ports_module.free_ports(1)]  # bounded
    assert mine not in picked and set(picked) <= set(others)


def test_port_runs_are_consecutive_free_and_disjoint() -> None:
    bases = free_port_runs(6, 3)
    every = [b + k for b in bases for k in range(3)]
    assert len(set(every)) == 18
    assert set(every) <= set(ports_module.candidate_ports())
    bind_all(every)
