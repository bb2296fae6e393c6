"""How many replicas each quorum queue is declared with (`x-quorum-initial-group-size`)."""

from __future__ import annotations

import pytest

from outpost.cluster.broker import topology
from outpost.settings import BrokerSettings


@pytest.mark.parametrize(
    ("addresses", "given", "size"), [(1, None, None), (2, None, 2), (3, None, 3), (5, None, 3)]
)
def test_the_default_is_the_addresses_given_up_to_three(
    addresses: int, given: int | None, size: int | None
) -> None:
    assert topology.quorum_size(addresses, given) == size


def test_a_given_size_wins_and_zero_leaves_it_to_rabbitmq() -> None:
    assert topology.quorum_size(1, 3) == 3
    assert topology.quorum_size(3, 0) is None


def test_every_quorum_queue_carries_the_size() -> None:
    assert "x-quorum-initial-group-size" not in topology.request_queue_arguments()
    assert topology.request_queue_arguments(3)["x-quorum-initial-group-size"] == 3
    assert topology.lane_arguments("m", 4, 3)["x-quorum-initial-group-size"] == 3
    assert topology.quorum_arguments(2) == {"x-queue-type": "quorum", "x-quorum-initial-group-size": 2}


def test_the_flag() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    BrokerSettings.add_to(parser)
    assert BrokerSettings.from_args(parser.parse_args(["--broker-quorum-size", "2"])).broker_quorum_size == 2
    assert BrokerSettings.from_args(parser.parse_args([])).broker_quorum_size is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--broker-quorum-size", "x"])
