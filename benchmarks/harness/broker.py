"""A real RabbitMQ for tests and benchmarks: `scripts/broker.sh` on free loopback ports (ports.py) in a
folder of its own; the tests' fixtures (tests/broker_fixture.py) and the cluster benchmark
(procs.running_broker) both start theirs from here.

`stop()` / `start()` restart it in place (same ports, same data: durable queues survive), for
recovery tests; `kill9` kills a node's VM as a crash would. With `tls` it also listens for amqps://
(and the management API for https) with the CA and certificates the script generates, and verifies
a client certificate when one is sent. The script installs Debian's rabbitmq-server when missing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from benchmarks.harness.ports import free_port_runs

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "broker.sh"
# Booting takes ~5 s on an idle machine; installing the package first, minutes.
START_TIMEOUT = 600.0
# What a node's boot failure says when one of its ports was bound by someone else meanwhile.
PORT_TAKEN = ("eaddrinuse", "could_not_start_listener", "address already in use")


class Broker:
    """One loopback broker (or a cluster of `nodes`); `url` carries the credentials, `broker_url`
    does not (a cluster's: every node's, comma-separated, as `--broker` takes them)."""

    user = "outpost"

    def __init__(
        self,
        state_dir: Path,
        management: bool = True,
        tls: bool = False,
        nodes: int = 1,
        listen: Sequence[str] = (),
        prefix: Sequence[str] = (),
    ) -> None:
        """`listen`: more addresses the AMQP listeners bind besides 127.0.0.1; `prefix`: a command the
        script runs under (`taskset -c CPUS`)."""
        self.state_dir = state_dir
        self.nodes = nodes
        self.prefix = list(prefix)
        self.management = management
        self.tls = tls
        self.password_file = state_dir / "password"
        tls_dir = state_dir / "tls"
        self.ca_file = tls_dir / "ca.pem"
        self.client_cert, self.client_key = tls_dir / "client.pem", tls_dir / "client.key"
        self.started = False
        self.env = dict(os.environ)  # tests may add to it before start()
        if listen:
            self.env["OUTPOST_BROKER_LISTEN"] = " ".join(listen)
        self._pick_ports()

    def _pick_ports(self) -> None:
        nodes = self.nodes
        self.amqp_port, dist, epmd, mgmt, self.tls_port, mgmt_tls = free_port_runs(6, nodes)
        self.mgmt_port = mgmt if self.management else 0
        self.env.update(
            OUTPOST_BROKER_DIR=str(self.state_dir),
            OUTPOST_BROKER_PORT=str(self.amqp_port),
            OUTPOST_BROKER_DIST_PORT=str(dist),
            OUTPOST_BROKER_EPMD_PORT=str(epmd),
            OUTPOST_BROKER_MGMT_PORT=str(self.mgmt_port),
            OUTPOST_BROKER_WAIT="240",
        )
        self.ports = [self.amqp_port + k for k in range(nodes)]
        self.broker_url = ",".join(f"amqp://{self.user}@127.0.0.1:{p}/" for p in self.ports)
        self.mgmt_url = f"http://127.0.0.1:{self.mgmt_port}" if self.management else ""
        if self.tls:
            self.env.update(
                OUTPOST_BROKER_TLS_PORT=str(self.tls_port),
                OUTPOST_BROKER_MGMT_TLS_PORT=str(mgmt_tls),
                OUTPOST_BROKER_TLS_CLIENT_CERTS="verify",
            )
        self.tls_url = f"amqps://{self.user}@127.0.0.1:{self.tls_port}/"
        # Every node's amqps:// URL, comma-separated (a cluster's; one node's: tls_url).
        self.tls_urls = ",".join(f"amqps://{self.user}@127.0.0.1:{self.tls_port + k}/" for k in range(nodes))
        self.mgmt_tls_url = f"https://127.0.0.1:{mgmt_tls}" if self.tls and self.management else ""

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.amqp_port}/"

    @property
    def urls(self) -> list[str]:
        """Each node's URL with the password."""
        return [f"amqp://{self.user}:{self.password}@127.0.0.1:{p}/" for p in self.ports]

    def flags(self, host: str | None = None) -> list[str]:
        """The `--broker` flags of a gateway or worker; `host`: the first node's port at that address."""
        url = self.broker_url if host is None else f"amqp://{self.user}@{host}:{self.amqp_port}/"
        return ["--broker", url, "--broker-password-file", str(self.password_file)]

    @property
    def mgmt_auth(self) -> tuple[str, str]:
        return (self.user, self.password)

    def _run(self, command: str, timeout: float) -> str:
        done = subprocess.run(
            [*self.prefix, str(SCRIPT), command, *(["--nodes", str(self.nodes)] if self.nodes > 1 else [])],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0 and command != "status":
            raise RuntimeError(f"broker.sh {command} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        return done.stdout

    def start(self) -> None:
        """Boot every node; the first start tries new ports once if a listener's port was taken."""
        try:
            out = self._run("start", START_TIMEOUT)
        except RuntimeError as error:
            self._run("stop", 120.0)  # the nodes that did boot must not outlive the test
            if self.started or not any(sign in str(error) for sign in PORT_TAKEN):
                raise
            self._pick_ports()  # a restart keeps its ports: the tests hold its URLs
            out = self._run("start", START_TIMEOUT)
        self.started = True
        assert out.splitlines()[0] == self.broker_url, out
        if self.tls:
            assert self.tls_urls in out.splitlines() and f"CA file: {self.ca_file}" in out, out
        else:
            assert "amqps://" not in out, out

    def stop(self) -> None:
        self._run("stop", 120.0)

    @contextmanager
    def booted(self) -> Iterator[Broker]:
        """Started for the block, stopped after it."""
        self.start()
        try:
            yield self
        finally:
            self.stop()

    def kill9(self, node: int = 1) -> None:
        """SIGKILL a node's Erlang VM (no clean shutdown, as a crash); `start()` boots it again."""
        folder = self.state_dir if node == 1 else self.state_dir / f"node{node}"
        pid = int((folder / "rabbit.pid").read_text().strip())
        os.kill(pid, signal.SIGKILL)
        for _ in range(600):  # bounded: 60 s
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                return
            if "\nState:\tZ" in status:  # dead, not yet reaped by whoever adopted it
                return
            time.sleep(0.1)
        raise AssertionError(f"the broker's VM {pid} outlived SIGKILL")

    def running(self) -> bool:
        return self._run("status", 60.0).startswith("running")
