"""Free loopback ports for the servers and brokers that tests and benchmarks start, picked outside the
ephemeral range.

Binding port 0 finds a free port in the kernel's ephemeral range, the range it also hands to every
outgoing connection on the machine. Between a test picking such a port and its server binding it
(seconds, for a RabbitMQ node), any connection may take it: CI once lost a three-node broker that
way (`eaddrinuse` on node 2's listener). A port outside that range is never handed out implicitly,
so one found free stays free unless another listener asks for it by number.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOWEST = 20000  # above the well-known and registered services a CI machine may run
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for implicit ports (Linux's default where it cannot be read)."""
    try:
        low, high = RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def candidate_ports() -> list[int]:
    """Every port at or above LOWEST that the kernel never picks for a connection (all of them
    where an unusual range leaves too few outside it)."""
    low, high = ephemeral_range()
    outside = [p for p in range(LOWEST, 65536) if not low <= p <= high]
    return outside if len(outside) >= 1000 else list(range(LOWEST, 65536))


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports outside the ephemeral range (held together while picked)."""
    candidates = candidate_ports()
    held: list[socket.socket] = []
    try:
        for port in random.sample(candidates, min(len(candidates), 50 * n)):  # bounded
            if len(held) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            held.append(s)
        if len(held) < n:
            raise AssertionError(f"no {n} free loopback ports among {50 * n} tried")
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def free_port_runs(n: int, run: int) -> list[int]:
    """`n` free loopback ports, each the first of `run` consecutive free ones (a cluster's nodes)."""
    allowed = set(candidate_ports())
    for _ in range(100):  # bounded: free ports are plentiful
        bases = free_ports(n)
        wanted = {b + i for b in bases for i in range(run)}
        if len(wanted) == n * run and wanted <= allowed:
            try:
                bind_all(sorted(wanted))
            except OSError:
                continue
            return bases
    raise AssertionError(f"no {n} runs of {run} free ports")


def bind_all(ports: list[int]) -> None:
    """Raises OSError unless every one of `ports` can be bound on 127.0.0.1 now."""
    socks = [socket.socket() for _ in ports]
    try:
        for s, port in zip(socks, ports, strict=True):
            s.bind(("127.0.0.1", port))
    finally:
        for s in socks:
            s.close()
