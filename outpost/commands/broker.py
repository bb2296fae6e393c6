"""The broker URLs a worker or a gateway connects to, from `BrokerSettings` (several: a cluster's nodes)."""

from __future__ import annotations

from outpost.cluster.broker.connection import TLS_FLAGS, broker_url
from outpost.settings import BrokerSettings


def connect_url(settings: BrokerSettings) -> str:
    """--broker with the password and the TLS files; ValueError (a usage error) when unusable."""
    if not settings.broker:
        raise ValueError("--broker is required (or $OUTPOST_BROKER / $OUTPOST_BROKER_URL)")
    tls_files = {name: getattr(settings, flag[2:].replace("-", "_")) for name, flag in TLS_FLAGS.items()}
    return broker_url(settings.broker, settings.broker_password_file, tls_files=tls_files)


def connect_urls(settings: BrokerSettings) -> list[str]:
    """Each address of a comma-separated --broker (the nodes of a RabbitMQ cluster), with the
    password and TLS files; the first that answers is used, the others after it is lost."""
    if not settings.broker:
        return [connect_url(settings)]  # the usage error
    urls = [u.strip() for u in settings.broker.split(",") if u.strip()]
    return [connect_url(settings.model_copy(update={"broker": url})) for url in urls]
