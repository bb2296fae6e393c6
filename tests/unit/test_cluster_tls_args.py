"""TLS to the broker without a broker: the URL the flags make, the SSL context it makes, what logs see."""

from __future__ import annotations

import asyncio
import datetime
import logging
import ssl
import urllib.parse
from pathlib import Path

import pytest
from aiormq.exceptions import AMQPConnectionError
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from outpost.cli import build_parser
from outpost.cluster.broker import connection, topology
from outpost.commands.broker import connect_url
from outpost.envflags import use_environment
from outpost.settings import BrokerSettings

SECRET = "s3cret/+:@pw"


def _cert(directory: Path, name: str, encrypt: bytes | None = None) -> tuple[str, str]:
    """A self-signed certificate and its key (encrypted with `encrypt` when given)."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    encryption = serialization.BestAvailableEncryption(encrypt) if encrypt else serialization.NoEncryption()
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(cert_path), str(key_path)


@pytest.fixture
def password_file(tmp_path: Path) -> str:
    path = tmp_path / "password"
    path.write_text(SECRET + "\n")
    return str(path)


def _query(url: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def test_flags_join_the_query_with_the_password_and_logs_see_neither(
    tmp_path: Path, password_file: str
) -> None:
    ca, _ = _cert(tmp_path, "ca")
    client, key = _cert(tmp_path, "client")
    files = {"cafile": ca, "certfile": client, "keyfile": key}
    url = connection.broker_url(
        "amqps://outpost@mq.internal:5671/prod?heartbeat=7&cafile=/old/ca.pem", password_file, tls_files=files
    )
    parts = urllib.parse.urlsplit(url)
    assert parts.scheme == "amqps" and parts.hostname == "mq.internal" and parts.port == 5671
    assert urllib.parse.unquote(parts.password or "") == SECRET and parts.path == "/prod"
    assert _query(url) == {"heartbeat": "7", **files}  # the flag beat the URL's own cafile
    shown = connection.redact(url)
    assert shown == "amqps://outpost@mq.internal:5671/prod"
    assert "s3cret" not in shown and urllib.parse.quote(SECRET, safe="") not in shown


def test_the_urls_own_query_is_kept_and_checked(tmp_path: Path) -> None:
    ca, _ = _cert(tmp_path, "ca")
    url = connection.broker_url(f"amqps://outpost@mq:5671/?cafile={ca}&name=x")
    assert _query(url) == {"cafile": ca, "name": "x"}
    assert connection.broker_url("amqp://outpost@mq/") == "amqp://outpost@mq/"  # plain, no password: as given
    with pytest.raises(ValueError, match=r"--broker-ca-file /nowhere/ca\.pem: No such file"):
        connection.broker_url("amqps://outpost@mq/?cafile=/nowhere/ca.pem")


@pytest.mark.parametrize(
    ("url", "files", "message"),
    [
        ("amqp://outpost@mq/", {"cafile": "CA"}, "--broker-ca-file: TLS options, for an amqps://"),
        ("amqp://outpost@mq/?cafile=x", {}, r"TLS options \(cafile\) need an amqps://"),
        ("amqps://outpost@mq/", {"keyfile": "KEY"}, "--broker-key-file needs --broker-cert-file"),
        ("amqps://outpost@mq/", {"cafile": "KEY"}, "cannot use the broker CA file"),  # a key is no CA
        ("amqps://outpost@mq/?cadata=AAAA", {}, "cadata is not supported"),
        ("amqps://outpost@mq/", {"cafile": "/nowhere"}, "--broker-ca-file /nowhere: No such file"),
    ],
)
def test_unusable_tls_settings_are_usage_errors(
    tmp_path: Path, url: str, files: dict[str, str], message: str
) -> None:
    _, key = _cert(tmp_path, "c")
    files = {name: key if path in ("CA", "KEY") else path for name, path in files.items()}
    with pytest.raises(ValueError, match=message):
        connection.broker_url(url, tls_files=dict(files))


def test_an_encrypted_client_key_is_an_error_not_a_prompt(tmp_path: Path) -> None:
    cert, key = _cert(tmp_path, "client", encrypt=b"passphrase")
    with pytest.raises(ValueError, match="client key is encrypted"):
        connection.broker_url("amqps://outpost@mq/", tls_files={"certfile": cert, "keyfile": key})


def test_the_context_verifies_the_given_ca_unless_told_not_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca, _ = _cert(tmp_path, "my-ca")
    assert connection.tls_context("amqp://mq/") is None
    context = connection.tls_context(f"amqps://mq/?cafile={ca}")
    assert context is not None and context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "my-ca"),),)]
    with caplog.at_level(logging.WARNING, logger="outpost.cluster"):
        url = connection.broker_url(f"amqps://mq/?cafile={ca}&no_verify_ssl=1")
    assert "not verified" in caplog.text
    unverified = connection.tls_context(url)
    assert unverified is not None and unverified.verify_mode == ssl.CERT_NONE


def test_tls_flags_and_their_variables_on_worker_and_gateway(tmp_path: Path, password_file: str) -> None:
    ca, _ = _cert(tmp_path, "ca")
    client, key = _cert(tmp_path, "client")
    env = {"OUTPOST_BROKER_CA_FILE": ca, "OUTPOST_BROKER_CERT_FILE": client, "OUTPOST_BROKER_KEY_FILE": key}
    env |= {"OUTPOST_BROKER": "amqps://outpost@mq:5671/", "OUTPOST_BROKER_PASSWORD_FILE": password_file}
    for argv in (["worker", "-m", "m.gguf"], ["gateway", "-m", "m.gguf"]):
        parser = build_parser()
        use_environment(parser, argv, env)
        args = parser.parse_args(argv)
        assert _query(connect_url(BrokerSettings.from_args(args))) == {
            "cafile": ca,
            "certfile": client,
            "keyfile": key,
        }
    parser = build_parser()
    argv = ["worker", "-m", "m.gguf", "--broker-ca-file", client]
    use_environment(parser, argv, env)
    assert (
        _query(connect_url(BrokerSettings.from_args(parser.parse_args(argv))))["cafile"] == client
    )  # the flag wins


def test_certificate_failures_are_named_and_not_retried() -> None:
    verify = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    verify.verify_message = "unable to get local issuer certificate"
    wrapped = AMQPConnectionError(*verify.args)
    wrapped.__cause__ = verify
    reason = connection._tls_failure(wrapped)
    assert reason is not None and "does not verify (unable to get local issuer certificate)" in reason
    wrong_port = AMQPConnectionError("x")
    wrong_port.__cause__ = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    assert connection._tls_failure(wrong_port) is not None
    # A connection lost mid-handshake or refused is an unreachable broker: retried by the callers.
    for transient in (ssl.SSLEOFError(8, "EOF"), ConnectionRefusedError(111, "refused")):
        lost = AMQPConnectionError("x")
        lost.__cause__ = transient
        assert connection._tls_failure(lost) is None


def test_the_management_api_defaults_to_https_for_amqps(caplog: pytest.LogCaptureFixture) -> None:
    # Only the management API is asked (no AMQP); the warning of a failed call says where it went.
    with caplog.at_level(logging.WARNING, logger="outpost.cluster"):
        ok = asyncio.run(topology.apply_length_policy("amqps://u@127.0.0.1:9/", None, ["m"], 5))
        assert not ok and "https://127.0.0.1:15671/" in caplog.text
        caplog.clear()
        ok = asyncio.run(topology.apply_length_policy("amqp://u@127.0.0.1:9/", None, ["m"], 5))
        assert not ok and "http://127.0.0.1:15672/" in caplog.text
