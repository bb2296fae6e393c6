"""A real rabbitmq-server for the cluster tests (skipped where none can be had)."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Broker:
    url: str  # without the password
    password_file: str
    management_url: str

    @property
    def full_url(self) -> str:
        from outpost.cluster.topology import broker_url

        return broker_url(self.url, self.password_file)


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    url = os.environ.get("OUTPOST_TEST_BROKER_URL")
    if url:
        parts = urllib.parse.urlsplit(url)
        yield Broker(
            url,
            os.environ["OUTPOST_TEST_BROKER_PASSWORD_FILE"],
            os.environ.get("OUTPOST_TEST_BROKER_MGMT_URL", f"http://{parts.hostname}:15672/"),
        )
        return
    pytest.skip("no broker: set OUTPOST_TEST_BROKER_URL")
    yield Broker("", "", "")


def broker_password(broker: Broker) -> str:
    return Path(broker.password_file).read_text().strip()
