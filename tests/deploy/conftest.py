"""The deploy tier (`make test-deploy`, `pytest -m deploy tests/deploy`): builds the container image here
and runs it with podman. Skipped by a plain `pytest tests`, since the first image build compiles llama.cpp.

OUTPOST_TEST_IMAGE=NAME:TAG uses an image already built (make test-deploy passes the one `make image`
printed); otherwise the session builds it with deploy/image.sh.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from podman_harness import COMPOSE_DIR, FIGURES, RABBITMQ_IMAGE, built_image, podman


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "deploy" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="deploy tier: run with make test-deploy (pytest -m deploy)")
    for item in items:
        if item.get_closest_marker("deploy"):
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for name, value in FIGURES.items():
        terminalreporter.write_line(f"deploy figure: {name}: {value}")


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: make deploy-deps installs it")
    yield built_image("OUTPOST_TEST_IMAGE", "image")


@pytest.fixture(scope="session")
def rabbitmq_image() -> str:
    """The stand-in broker image of the compose tests (cached layers after the first build: seconds)."""
    podman(
        "build", "--network=host", "--pull=never", "--format", "docker",
        "-f", str(COMPOSE_DIR / "rabbitmq.Containerfile"), "-t", RABBITMQ_IMAGE, str(COMPOSE_DIR),
        timeout=900,
    )  # fmt: skip
    return RABBITMQ_IMAGE
