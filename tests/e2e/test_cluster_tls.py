"""`outpost worker` and `outpost gateway` over amqps:// to a real rabbitmq-server with TLS listeners.

The broker (`rabbitmq_tls`, this module's own) uses the CA and certificates scripts/broker.sh
generates and verifies a client certificate when one is sent. The worker gets the CA by
environment, the gateway by flags along with a client certificate (mutual TLS), and reaches the
management API over https. A CA that did not sign the broker's certificate stops both processes
at once with the reason in their logs.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from cluster_harness import START_TIMEOUT, Gateway, Proc, live, worker
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from benchmarks.harness.broker import Broker
from outpost.cluster.broker import connection

pytestmark = [pytest.mark.cluster, pytest.mark.broker]
VERIFY_FAILED = "certificate does not verify"


@dataclass
class Via:
    """The TLS broker as the harness reads a broker: its amqps:// URL and https management API."""

    broker_url: str
    password_file: Path
    mgmt_url: str


def _via(broker: Broker) -> Via:
    return Via(broker.tls_url, broker.password_file, broker.mgmt_tls_url)


def _self_signed(directory: Path, cn: str) -> tuple[Path, Path]:
    """A self-signed CA certificate and its key: a CA that signed nothing the broker has."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / f"{cn}.pem", directory / f"{cn}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fmt = serialization.PrivateFormat.PKCS8
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture(scope="module")
def model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model under its own name: its own queue on this broker."""
    path = tmp_path_factory.mktemp("tls-model") / "tls-tiny.gguf"
    shutil.copyfile(tiny_model, path)
    return path


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _self_signed(tmp_path_factory.mktemp("other-ca"), "other-ca")[0]


def _url(broker: Broker, **query: str) -> str:
    return connection.broker_url(broker.tls_url, str(broker.password_file), tls_files=dict(query))


def _connect_error(url: str) -> BaseException | None:
    async def attempt() -> BaseException | None:
        try:
            conn = await asyncio.wait_for(connection.connect(url, "outpost-test tls"), 60)
        except Exception as exc:
            return exc
        await conn.close()
        return None

    return asyncio.run(attempt())


def test_topology_connect_verifies_the_broker_and_sends_the_client_certificate(
    rabbitmq_tls: Broker, other_ca: Path, tmp_path: Path
) -> None:
    broker = rabbitmq_tls
    assert _connect_error(_url(broker, cafile=str(broker.ca_file))) is None
    client = {"certfile": str(broker.client_cert), "keyfile": str(broker.client_key)}
    assert _connect_error(_url(broker, cafile=str(broker.ca_file), **client)) is None
    # Failures no retry fixes are BrokerTLSError, raised at once, each with its reason.
    wrong_ca = _connect_error(_url(broker, cafile=str(other_ca)))
    assert isinstance(wrong_ca, connection.BrokerTLSError) and VERIFY_FAILED in str(wrong_ca), wrong_ca
    rogue_cert, rogue_key = _self_signed(tmp_path, "rogue-client")
    rogue = {"certfile": str(rogue_cert), "keyfile": str(rogue_key)}
    # Refused, so it was sent (the broker takes clients without one). With TLS 1.3 the broker's
    # verdict comes after the handshake: the client reads its alert or a reset, whichever wins.
    refused = _connect_error(_url(broker, cafile=str(broker.ca_file), **rogue))
    assert refused is not None
    plain_port = _url(broker, cafile=str(broker.ca_file)).replace(
        f":{broker.tls_port}/", f":{broker.amqp_port}/"
    )
    wrong_port = _connect_error(plain_port)
    assert isinstance(wrong_port, connection.BrokerTLSError) and "TLS listener" in str(wrong_port), wrong_port


@pytest.fixture
def tls_fleet(rabbitmq_tls: Broker, model: Path) -> Iterator[tuple[Gateway, Proc]]:
    broker = rabbitmq_tls
    ca_env = {"OUTPOST_BROKER_CA_FILE": str(broker.ca_file)}
    flags = ["--broker-ca-file", str(broker.ca_file), "--broker-cert-file", str(broker.client_cert)]
    flags += ["--broker-key-file", str(broker.client_key)]
    gateway = Gateway(_via(broker), [model], *flags)
    tls_worker = worker(_via(broker), model, "-np", "2", env=ca_env)
    try:
        gateway.wait_until(lambda h: h.get("status") == "ok" and len(live(h)) == 1, "a live worker")
        yield gateway, tls_worker
    finally:
        tls_worker.stop()
        gateway.stop()


def _management(broker: Broker, path: str) -> httpx.Response:
    """GET from the management API over https, verified with the broker's CA."""
    verify = ssl.create_default_context(cafile=str(broker.ca_file))
    return httpx.get(f"{broker.mgmt_tls_url}/api/{path}", auth=broker.mgmt_auth, verify=verify, timeout=30)


def _connections(broker: Broker, want: int) -> list[dict[str, Any]]:
    """The broker's client connections named outpost-*, once there are `want` of them."""
    deadline, found = time.monotonic() + 60, []
    while time.monotonic() < deadline:
        reply = _management(broker, "connections")
        reply.raise_for_status()
        found = [
            c
            for c in reply.json()
            if str(c.get("client_properties", {}).get("connection_name", "")).startswith(
                ("outpost-gateway", "outpost-worker")
            )
        ]
        if len(found) >= want:
            return found
        time.sleep(0.2)
    raise TimeoutError(f"{want} outpost connections not listed within 60 s: {found}")


def test_chat_completion_through_a_tls_gateway_and_worker(
    rabbitmq_tls: Broker, tls_fleet: tuple[Gateway, Proc], model: Path
) -> None:
    gateway, tls_worker = tls_fleet
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
        model=model.stem, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content and reply.usage is not None
    assert reply.usage.completion_tokens > 0
    by_name = {c["client_properties"]["connection_name"].split()[0]: c for c in _connections(rabbitmq_tls, 2)}
    assert by_name["outpost-gateway"]["ssl"] and by_name["outpost-worker"]["ssl"]
    assert by_name["outpost-gateway"]["peer_cert_subject"] == "CN=outpost-client"  # mutual TLS
    assert not by_name["outpost-worker"].get("peer_cert_subject")  # the CA only: no client certificate
    # The queue length policy went through the management API over https, verified with the CA.
    policy = _management(rabbitmq_tls, f"policies/%2F/outpost-req-{model.stem}")
    assert policy.status_code == 200, gateway.stderr()
    for log in (gateway.stderr(), tls_worker.stderr()):
        assert rabbitmq_tls.password not in log


def test_a_ca_that_did_not_sign_the_broker_stops_gateway_and_worker(
    rabbitmq_tls: Broker, model: Path, other_ca: Path
) -> None:
    gateway = Gateway(_via(rabbitmq_tls), [model], "--broker-ca-file", str(other_ca))
    bad_worker = worker(_via(rabbitmq_tls), model, env={"OUTPOST_BROKER_CA_FILE": str(other_ca)})
    try:
        # Bounded: both fail on the first handshake instead of retrying an unreachable broker.
        assert gateway.wait(START_TIMEOUT) == 1, gateway.stderr()
        assert bad_worker.wait(START_TIMEOUT) == 1, bad_worker.stderr()
    finally:
        gateway.stop()
        bad_worker.stop()
    for log in (gateway.stderr(), bad_worker.stderr()):
        assert VERIFY_FAILED in log and f"127.0.0.1:{rabbitmq_tls.tls_port}" in log, log
        assert "--broker-ca-file" in log and rabbitmq_tls.password not in log
