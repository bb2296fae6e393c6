"""Connecting to the broker: its URL with the password and TLS files, the TLS context, the connection.

The password comes from a file or the environment, never the URL. An `amqps://` URL
is TLS; its query carries the options aiormq knows by these names (`cafile`, `capath`, `certfile`,
`keyfile`, `no_verify_ssl`), which `--broker-ca-file` / `--broker-cert-file` / `--broker-key-file`
fill in. The SSL context is built here, not by aiormq, so a bad file is a usage error at startup
and the management API (https for amqps) is verified against the same CA. A handshake that fails
for a certificate is `BrokerTLSError`: no retry fixes it, so callers do not retry it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractConnection
from aio_pika.connection import make_url
from aiormq.exceptions import AMQPError

_log = logging.getLogger("outpost.cluster")

TLS_FLAGS = {"cafile": "--broker-ca-file", "certfile": "--broker-cert-file", "keyfile": "--broker-key-file"}
TLS_QUERY = (*TLS_FLAGS, "capath", "no_verify_ssl")


class BrokerTLSError(Exception):
    """The TLS handshake with the broker failed for a reason no retry fixes (a certificate, a port)."""


def broker_url(
    url: str,
    password_file: str | None = None,
    env_var: str = "OUTPOST_BROKER_PASSWORD",
    tls_files: Mapping[str, str | None] | None = None,
) -> str:
    """The AMQP URL with the password from a file or the environment (never from argv).

    `tls_files` (query name -> path, from the --broker-*-file flags) join the URL's query; the
    TLS settings are checked here, so a missing or unreadable file stops the process at once."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise ValueError(f"--broker must be an amqp:// or amqps:// URL, not {url!r}")
    if parts.password:
        raise ValueError("put the broker password in --broker-password-file or $" + env_var + ", not the URL")
    query = _with_tls_files(parts, tls_files or {})
    password = None
    if password_file:
        password = Path(password_file).read_text().strip()
    elif os.environ.get(env_var):
        password = os.environ[env_var]
    netloc = parts.netloc
    if password is not None:
        user = urllib.parse.quote(parts.username or "guest", safe="")
        host = parts.hostname or "127.0.0.1"
        netloc = f"{user}:{urllib.parse.quote(password, safe='')}@{host}" + (
            f":{parts.port}" if parts.port else ""
        )
    full = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    context = tls_context(full)
    if context is not None and context.verify_mode == ssl.CERT_NONE:
        _log.warning("no_verify_ssl: the broker's TLS certificate is not verified (anyone can pose as it)")
    return full


def _with_tls_files(parts: urllib.parse.SplitResult, tls_files: Mapping[str, str | None]) -> str:
    """The URL's query with the flags' files added (a flag wins over the same query parameter)."""
    given = {name: path for name, path in tls_files.items() if path}
    if not given:
        return parts.query
    if parts.scheme != "amqps":
        flags = ", ".join(TLS_FLAGS[name] for name in given)
        raise ValueError(f"{flags}: TLS options, for an amqps:// --broker URL, not {parts.scheme}://")
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k not in given]
    pairs += [(name, str(Path(path).expanduser())) for name, path in given.items()]
    return urllib.parse.urlencode(pairs, safe="/", quote_via=urllib.parse.quote)


def tls_context(url: str) -> ssl.SSLContext | None:
    """The SSL context an amqps:// URL's query describes (None for amqp://); ValueError if unusable."""
    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    tls = {k: v for k, v in query.items() if k in TLS_QUERY or k == "cadata"}
    if parts.scheme != "amqps":
        if tls:
            raise ValueError(f"TLS options ({', '.join(sorted(tls))}) need an amqps:// broker URL")
        return None
    if "cadata" in tls:
        raise ValueError("the broker URL's cadata is not supported: give a CA file (--broker-ca-file)")
    if tls.get("keyfile") and not tls.get("certfile"):
        raise ValueError("--broker-key-file needs --broker-cert-file (the client certificate)")
    try:
        context = ssl.create_default_context(
            cafile=_readable(tls, "cafile"), capath=tls.get("capath") or None
        )
    except ssl.SSLError as exc:
        raise ValueError(f"cannot use the broker CA file {tls['cafile']}: {exc}") from exc
    certfile = _readable(tls, "certfile")
    if certfile is not None:
        try:
            context.load_cert_chain(certfile, _readable(tls, "keyfile"), _no_password)
        except ssl.SSLError as exc:
            raise ValueError(f"cannot use the broker client certificate {certfile}: {exc}") from exc
    if tls.get("no_verify_ssl", "0") != "0":  # aiormq's meaning: anything but 0 turns verification off
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def _readable(tls: dict[str, str], name: str) -> str | None:
    """The file a TLS option names, checked now so the error names the option, not an SSL call."""
    path = tls.get(name)
    if not path:
        return None
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ValueError(f"{TLS_FLAGS[name]} {path}: {exc.strerror or exc}") from exc
    return path


def _no_password() -> str:
    # Without this callback OpenSSL would prompt on the terminal for an encrypted key: a hang.
    raise ValueError("the broker client key is encrypted: give an unencrypted key file (mode 600)")


def redact(url: str) -> str:
    """The URL as logs may show it: no password, no query (TLS file paths stay out of logs too)."""
    parts = urllib.parse.urlsplit(url)
    host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname)
    user = f"{parts.username}@" if parts.username else ""
    return f"{parts.scheme}://{user}{host}{parts.path}"


async def connect(url: str, name: str, heartbeat: int = 2) -> AbstractConnection:
    """A plain connection (session.py rebuilds everything on it after a loss; nothing here reconnects).

    Raises BrokerTLSError when the TLS handshake fails for a certificate or a wrong port: callers
    retry unreachable brokers, and a retry would only hide that."""
    # The heartbeat goes in the URL's query: aiormq reads it only there (aio-pika drops a
    # `heartbeat=` keyword, and the connection would run on aiormq's default of 60 s).
    conn = aio_pika.Connection(make_url(_named(url, name, heartbeat)), ssl_context=tls_context(url))
    try:
        await conn.connect()
        return conn
    except BaseException as exc:
        # Closed whenever connecting does not end in a connection (a caller cancelled mid-connect
        # must leave nothing running).
        await asyncio.shield(conn.close())
        reason = _tls_failure(exc) if isinstance(exc, OSError | AMQPError) else None
        if reason is None:
            raise
        parts = urllib.parse.urlsplit(url)
        raise BrokerTLSError(
            f"cannot connect to the broker at {parts.hostname}:{parts.port or 5671} over TLS: {reason}"
        ) from exc


def _named(url: str, name: str, heartbeat: int) -> str:
    """`url` with the connection name the broker lists (aio-pika drops client_properties given a URL)
    and the AMQP heartbeat in seconds."""
    parts = urllib.parse.urlsplit(url)
    own = ("name", "heartbeat")
    pairs = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True) if k not in own]
    pairs += [("name", name), ("heartbeat", str(heartbeat))]
    query = urllib.parse.urlencode(pairs, safe="/", quote_via=urllib.parse.quote)
    return urllib.parse.urlunsplit(parts._replace(query=query))


def _tls_failure(exc: BaseException) -> str | None:
    """Why the TLS handshake failed, if that is what `exc` (or what caused it) says; else None."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return (
                f"its certificate does not verify ({seen.verify_message}); give the CA that signed it "
                "with --broker-ca-file"
            )
        # EOF / syscall errors are a connection lost mid-handshake (a broker restarting): retried.
        if isinstance(seen, ssl.SSLError) and not isinstance(
            seen, ssl.SSLEOFError | ssl.SSLZeroReturnError | ssl.SSLSyscallError
        ):
            what = getattr(seen, "reason", None) or seen  # set by OpenSSL's errors, not by every SSLError
            return (
                f"{what} (is the port the broker's TLS listener, and does it accept this client certificate?)"
            )
        seen = seen.__cause__ or seen.__context__
    return None
