"""A real OTLP collector for tests: the `rotel` wheel's agent on free loopback ports.

It receives OTLP over HTTP and gRPC, drops what it receives (blackhole exporter) and prints every
span to its debug log, which `spans()` parses. The fixture `otlp_collector` (registered in
tests/conftest.py) gives one per test.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from benchmarks.harness.ports import free_ports


@dataclass
class CollectedSpan:
    trace_id: str
    parent_id: str
    span_id: str
    name: str
    kind: str = ""
    service: str = ""
    start_ns: int = 0
    end_ns: int = 0
    attributes: dict[str, str] = field(default_factory=dict)


_FIELD = re.compile(r"^\s*(Trace ID|Parent ID|ID|Name|Kind)\s*:\s*(.*)$")
_TIME = re.compile(r"^\s*(Start time|End time)\s*:\s*(\d+)")
_ATTR = re.compile(r"^\s*-> ([\w.]+): \w+\((.*)\)$")


def parse_debug_log(text: str) -> list[CollectedSpan]:
    """Spans from the collector's `--debug-log traces --debug-log-verbosity detailed` output."""
    spans: list[CollectedSpan] = []
    service = ""
    in_resource = False
    for line in text.splitlines():
        if line.startswith("ResourceSpans #"):
            in_resource, service = True, ""
            continue
        if line.startswith("ScopeSpans #") or line.startswith("Span #"):
            in_resource = False
            if line.startswith("Span #"):
                spans.append(CollectedSpan("", "", "", "", service=service))
            continue
        attr = _ATTR.match(line)
        if attr is not None:
            if in_resource and attr.group(1) == "service.name":
                service = attr.group(2)
            elif spans and not in_resource:
                spans[-1].attributes[attr.group(1)] = attr.group(2)
            continue
        if not spans:
            continue
        span = spans[-1]
        m = _FIELD.match(line)
        if m is not None:
            key, value = m.group(1), m.group(2).strip()
            if key == "Trace ID":
                span.trace_id = value
            elif key == "Parent ID":
                span.parent_id = value
            elif key == "ID":
                span.span_id = value
            elif key == "Name":
                span.name = value
            else:
                span.kind = value
            continue
        t = _TIME.match(line)
        if t is not None:
            if t.group(1) == "Start time":
                span.start_ns = int(t.group(2))
            else:
                span.end_ns = int(t.group(2))
    return spans


def agent_binary() -> Path:
    import rotel

    return Path(rotel.__file__).parent / "rotel-agent"


class Collector:
    """`rotel-agent start` in the foreground; `http_endpoint` is what --otlp-endpoint takes."""

    def __init__(self) -> None:
        self.http_port, self.grpc_port = free_ports(2)
        self.http_endpoint = f"http://127.0.0.1:{self.http_port}"
        self.grpc_endpoint = f"127.0.0.1:{self.grpc_port}"
        self._dir = Path(tempfile.mkdtemp(prefix="otlp-collector-"))
        self.output = self._dir / "spans.log"
        binary = agent_binary()
        binary.chmod(binary.stat().st_mode | 0o111)  # wheels may drop the executable bit
        cmd = [
            str(binary),
            "start",
            "--exporter",
            "blackhole",
            "--debug-log",
            "traces",
            "--debug-log-verbosity",
            "detailed",
            "--otlp-http-endpoint",
            f"127.0.0.1:{self.http_port}",
            "--otlp-grpc-endpoint",
            self.grpc_endpoint,
            "--pid-file",
            str(self._dir / "rotel.pid"),
            "--log-file",
            str(self._dir / "rotel.log"),
        ]
        self._out = self.output.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT)
        self._wait_listening(60.0)

    def _wait_listening(self, timeout: float) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rotel-agent exited {self.proc.returncode}:\n{self.text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.http_port)) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"rotel-agent not listening within {timeout} s:\n{self.text()}")

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def spans(self) -> list[CollectedSpan]:
        return parse_debug_log(self.text())

    def wait_spans(self, predicate: object, timeout: float = 60.0) -> list[CollectedSpan]:
        """Poll until `predicate(spans)` is true; returns the spans (raises with them on timeout)."""
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"collector spans not as expected after {timeout} s: {spans}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def otlp_collector() -> Iterator[Collector]:
    """A real OTLP collector on loopback for one test; its received spans via `.spans()`."""
    collector = Collector()
    try:
        yield collector
    finally:
        collector.stop()
