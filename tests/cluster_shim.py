"""TEMPORARY until cluster-infra's `rabbitmq` fixture is merged: the same surface, from the environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


class Broker:
    user = "outpost"

    def __init__(self) -> None:
        self.broker_url = os.environ["OUTPOST_TEST_BROKER_URL"]
        self.password_file = Path(os.environ["OUTPOST_TEST_BROKER_PASSWORD_FILE"])
        self.mgmt_url = os.environ["OUTPOST_TEST_BROKER_MGMT_URL"]
        self.amqp_port = int(self.broker_url.rsplit(":", 1)[1].strip("/"))

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def url(self) -> str:
        return f"amqp://{self.user}:{self.password}@127.0.0.1:{self.amqp_port}/"


@pytest.fixture(scope="session")
def rabbitmq() -> Iterator[Broker]:
    if not os.environ.get("OUTPOST_TEST_BROKER_URL"):
        pytest.skip("no broker")
    yield Broker()
