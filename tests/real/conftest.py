"""The real tier's shared, costly pieces, made once per test session: the chat server on the real
SmolLM2 that the chat and agent checks share, and llama-cpp-python's `Llama` on it (the reference
the parity and end-of-turn checks read). Each server start or `Llama` load costs seconds of a
shared 2-core CPU; a check that needs its own settings (one stream, the prompt cache off) starts
its own server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.server_harness import Server
from llama_reference import Reference
from real_server import serve


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
