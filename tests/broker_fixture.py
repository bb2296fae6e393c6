"""The tests' real RabbitMQs (benchmarks/harness/broker.py), as fixtures registered in tests/conftest.py.

`rabbitmq` boots one broker for the whole test session and stops it at the end. `rabbitmq_tls` is
another broker, per test module, that also listens for amqps:// (and the management API for https);
only the TLS tests use it, so the session broker stays plain.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from benchmarks.harness.broker import Broker


@pytest.fixture(scope="session")
def rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A real rabbitmq-server for the session, on free 127.0.0.1 ports; stopped at the end."""
    with Broker(tmp_path_factory.mktemp("rabbitmq")).booted() as broker:
        yield broker


@pytest.fixture(scope="module")
def rabbitmq_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker with TLS listeners (amqps://, https management) for one test module; stopped after it."""
    with Broker(tmp_path_factory.mktemp("rabbitmq-tls"), tls=True).booted() as broker:
        yield broker
