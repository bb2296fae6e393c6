"""`BrokerSettings` (how a worker or a gateway reaches RabbitMQ) and `TracingSettings` (all three
servers). To add a flag to either, add one field with `setting(...)` (outpost/settings/fields.py)."""

from __future__ import annotations

from pydantic import field_validator

from outpost.settings.fields import Block, setting


class BrokerSettings(Block):
    """The broker's URL, password and TLS files; `outpost.cluster.broker.connection.broker_url` joins them."""

    broker: str | None = setting(
        None,
        "--broker",
        help="RabbitMQ URL without the password, e.g. amqp://outpost@10.0.1.5/ (amqps:// for TLS); "
        "a RabbitMQ cluster's nodes comma-separated (the first that answers; the next when it is lost)",
    )
    broker_password_file: str | None = setting(
        None,
        "--broker-password-file",
        help="file holding the broker password (else $OUTPOST_BROKER_PASSWORD)",
    )
    broker_ca_file: str | None = setting(
        None,
        "--broker-ca-file",
        help="PEM CA certificate(s) the broker's TLS certificate must verify against "
        "(amqps://; default: the system's CAs)",
    )
    broker_cert_file: str | None = setting(
        None,
        "--broker-cert-file",
        help="PEM client certificate, for a broker that asks for one (mutual TLS)",
    )
    broker_key_file: str | None = setting(
        None,
        "--broker-key-file",
        help="the client certificate's unencrypted PEM key (default: in --broker-cert-file)",
    )
    broker_quorum_size: int | None = setting(
        None,
        "--broker-quorum-size",
        help="replicas of each quorum queue (x-quorum-initial-group-size) on a RabbitMQ cluster; "
        "default: the number of --broker addresses, at most 3 (one address: RabbitMQ's default); "
        "0: RabbitMQ's default. Give every gateway and worker the same",
        parse=int,
        ge=0,
    )


class TracingSettings(Block):
    """Where spans go (serve: each request's phases; gateway: its request span; worker: queue wait,
    prefill and decode)."""

    otlp_endpoint: str | None = setting(
        None,
        "--otlp-endpoint",
        help="export OpenTelemetry spans to this OTLP/HTTP collector URL, e.g. http://127.0.0.1:4318",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _blank_is_off(cls, url: str | None) -> str | None:
        return url or None
