"""The converter's pieces without a model: pre-tokenizer choice, config parsing, safetensors reading,
the Q/K permutation, output types and architecture checks."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from outpost.models.convert import pretokenizer as pt
from outpost.models.convert.archs import ARCHITECTURES, arch_for, llama3_rope_factors, validate
from outpost.models.convert.hparams import parse_hparams, parse_rope
from outpost.models.convert.st_reader import open_checkpoint, read_rows
from outpost.models.convert.tensors import output_type, permute_rows
from outpost.models.convert.vocab_parts import TokenizerFiles, add_special_flags

# ---------------------------------------------------------------- pre-tokenizer


def _tokenizer_json(pre: Any, ignore_merges: bool = False) -> dict[str, Any]:
    """A real tokenizer.json (serialised by the tokenizers library) with this pre-tokenizer."""
    from tokenizers import Tokenizer, models

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.pre_tokenizer = pre
    data: dict[str, Any] = json.loads(tok.to_str())
    return data


def _hf_pre_tokenizer(structure: pt.PreTokenizer) -> Any:
    """The HF pre-tokenizer objects a model family uses for this structure."""
    from tokenizers import Regex, pre_tokenizers

    steps: list[Any] = []
    byte_level_regex = bool(structure.splits) and structure.splits[-1] == pt.GPT2
    splits = structure.splits[:-1] if byte_level_regex else structure.splits
    for regex in splits:
        if regex == r"\p{N}":
            steps.append(pre_tokenizers.Digits(individual_digits=True))
        else:
            steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=byte_level_regex))
    return steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)


@pytest.mark.parametrize("name", list(pt.KNOWN))
def test_each_known_structure_is_recognised(name: str) -> None:
    structure = pt.KNOWN[name]
    tokenizer_json = _tokenizer_json(_hf_pre_tokenizer(structure), structure.ignore_merges)
    assert pt.choose_pre_tokenizer(tokenizer_json) == name


def test_known_names_are_llama_cpp_names() -> None:
    assert set(pt.KNOWN) <= pt.LLAMA_CPP_NAMES


def test_ignore_merges_tells_llama3_from_smaug() -> None:
    pre = _hf_pre_tokenizer(pt.KNOWN["llama-bpe"])
    assert pt.choose_pre_tokenizer(_tokenizer_json(pre, ignore_merges=True)) == "llama-bpe"
    assert pt.choose_pre_tokenizer(_tokenizer_json(pre, ignore_merges=False)) == "smaug-bpe"


def test_unknown_regex_is_named_and_override_wins() -> None:
    from tokenizers import Regex, pre_tokenizers

    custom = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{L}+|\d{1,2}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer_json = _tokenizer_json(custom)
    with pytest.raises(ValueError, match=r"\\p\{L\}\+\|\\d\{1,2\}.*--pre-tokenizer"):
        pt.choose_pre_tokenizer(tokenizer_json)
    assert pt.choose_pre_tokenizer(tokenizer_json, "qwen2") == "qwen2"
    with pytest.raises(ValueError, match=r"not a name llama\.cpp knows"):
        pt.choose_pre_tokenizer(tokenizer_json, "my-own")


def test_unsupported_normalizer_is_refused() -> None:
    tokenizer_json = _tokenizer_json(_hf_pre_tokenizer(pt.KNOWN["gpt-2"]))
    tokenizer_json["normalizer"] = {"type": "Lowercase"}
    with pytest.raises(ValueError, match="Lowercase normalizer"):
        pt.choose_pre_tokenizer(tokenizer_json)
    tokenizer_json["normalizer"] = {"type": "NFC"}
    assert pt.choose_pre_tokenizer(tokenizer_json) == "gpt-2"


# ---------------------------------------------------------------- config


def _llama_config(**extra: Any) -> dict[str, Any]:
    base = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 256,
    }
    return {**base, **extra}


def test_gemma3_config_before_and_after_transformers_5() -> None:
    common = {
        "architectures": ["Gemma3ForCausalLM"],
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "num_hidden_layers": 6,
        "intermediate_size": 128,
        "vocab_size": 100,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 512,
        "query_pre_attn_scalar": 16,
    }
    old = {**common, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "sliding_window_pattern": 6}
    new = {
        **common,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    }
    for config in (old, new):
        hp = parse_hparams(config, tied_default=True)
        assert hp.swa_layers == (True,) * 5 + (False,)
        assert hp.rope.theta == 1e6 and hp.rope_swa is not None and hp.rope_swa.theta == 1e4
        assert hp.tied_embeddings and hp.head_dim == 16
        validate(ARCHITECTURES["Gemma3ForCausalLM"], hp)


def test_gemma3_query_scale_llama_cpp_cannot_express_is_refused() -> None:
    config = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "head_dim": 32,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 16,
    }
    hp = parse_hparams(config, tied_default=True)
    with pytest.raises(ValueError, match="query_pre_attn_scalar"):
        validate(ARCHITECTURES["Gemma3ForCausalLM"], hp)


def test_qwen2_window_switched_off_is_no_window() -> None:
    hp = parse_hparams(_llama_config(sliding_window=4096, use_sliding_window=False), tied_default=False)
    assert hp.swa_layers == () and hp.sliding_window is None


def test_rope_scalings() -> None:
    config = {"max_position_embeddings": 131072, "original_max_position_embeddings": 4096}
    long_rope = parse_rope(
        {"rope_type": "longrope", "long_factor": [2.0, 3.0], "short_factor": [1.0, 1.5]}, config
    )
    assert long_rope.attention_factor == pytest.approx(math.sqrt(1 + math.log(32) / math.log(4096)))
    assert parse_rope({"type": "linear", "factor": 4.0}, {}).factor == 4.0
    yarn = parse_rope({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, {})
    assert (yarn.kind, yarn.original_context) == ("yarn", 32768)
    with pytest.raises(ValueError, match="'dynamic' is not supported"):
        parse_rope({"rope_type": "dynamic", "factor": 2.0}, {})


def test_llama3_factors_follow_the_wavelength_bands() -> None:
    rope = parse_rope(
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_theta": 500000.0,
        },
        {},
    )
    factors = llama3_rope_factors(rope, 128)
    wavelen = 2 * np.pi * 500000.0 ** (np.arange(0, 128, 2) / 128)
    assert np.all(factors[wavelen < 8192 / 4] == 1.0)
    assert np.all(factors[wavelen > 8192] == 8.0)
    between = factors[(wavelen >= 2048) & (wavelen <= 8192)]
    assert between.size and np.all((between > 1.0) & (between < 8.0))


def test_unsupported_architecture_lists_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"GPTNeoXForCausalLM.*LlamaForCausalLM.*Phi3ForCausalLM"):
        arch_for({"architectures": ["GPTNeoXForCausalLM"]})


def test_activation_llama_cpp_does_not_compute_is_refused() -> None:
    hp = parse_hparams(_llama_config(hidden_act="gelu"), tied_default=False)
    with pytest.raises(ValueError, match="activation 'gelu'"):
        validate(ARCHITECTURES["LlamaForCausalLM"], hp)


# ---------------------------------------------------------------- tensors


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name, (dtype, raw) in tensors.items():
        data = raw.tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(raw.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs))


def test_safetensors_rows_in_every_dtype(tmp_path: Path) -> None:
    values = np.arange(-12, 12, dtype=np.float32).reshape(6, 4) / 4  # exact in f16 and bf16
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    _write_safetensors(
        tmp_path / "model.safetensors",
        {
            "a": ("F32", values),
            "b": ("F16", values.astype(np.float16)),
            "c": ("BF16", bf16),
            "n": ("F32", values[0]),
        },
    )
    (tmp_path / "consolidated.safetensors").write_bytes(b"never read")
    entries = open_checkpoint(tmp_path)
    assert set(entries) == {"a", "b", "c", "n"}
    for name in "abc":
        np.testing.assert_array_equal(read_rows(entries[name], 2, 5), values[2:5])
    np.testing.assert_array_equal(read_rows(entries["n"], 0, 4), values[0])


def test_quantized_checkpoints_are_refused(tmp_path: Path) -> None:
    _write_safetensors(tmp_path / "model.safetensors", {"w": ("F8_E4M3", np.zeros(4, np.uint8))})
    with pytest.raises(ValueError, match="F8_E4M3"):
        open_checkpoint(tmp_path)


def test_sharded_checkpoint_follows_its_index(tmp_path: Path) -> None:
    one = np.ones((2, 2), np.float32)
    _write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"x": ("F32", one)})
    _write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"y": ("F32", one * 2)})
    index = {"weight_map": {"x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    entries = open_checkpoint(tmp_path)
    assert read_rows(entries["y"], 0, 2).tolist() == [[2.0, 2.0], [2.0, 2.0]]


def test_permutation_interleaves_each_heads_halves() -> None:
    n_heads, head_dim = 3, 8
    rows = np.arange(n_heads * head_dim, dtype=np.float32)[:, None] * np.ones((1, 5), np.float32)
    out = permute_rows(rows, n_heads)
    for h in range(n_heads):
        for j in range(head_dim // 2):
            assert out[h * head_dim + 2 * j, 0] == h * head_dim + j
            assert out[h * head_dim + 2 * j + 1, 0] == h * head_dim + head_dim // 2 + j
    assert permute_rows(rows[:, 0], n_heads).tolist() == out[:, 0].tolist()  # biases alike


def test_output_types() -> None:
    assert output_type((64,), "q8_0") == GGMLQuantizationType.F32
    assert output_type((64, 64), "q8_0") == GGMLQuantizationType.Q8_0
    assert output_type((64, 48), "q8_0") == GGMLQuantizationType.F16  # rows not a multiple of 32
    assert output_type((64, 48), "bf16") == GGMLQuantizationType.BF16


# ---------------------------------------------------------------- special tokens


def test_add_bos_from_config_flag_else_post_processor(tmp_path: Path) -> None:
    tokens = ["<s>", "</s>", "a"]
    ids = {"bos": 0, "eos": 1}
    template = {
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
            ],
        }
    }

    def files(tokenizer_json: dict[str, Any], tok_config: dict[str, Any]) -> TokenizerFiles:
        return TokenizerFiles(tmp_path, tokenizer_json, tok_config, {})

    assert add_special_flags(files(template, {}), tokens, ids, default_bos=False) == (True, False)
    assert add_special_flags(files({}, {}), tokens, ids, default_bos=True) == (True, False)
    flags = {"add_bos_token": False, "add_eos_token": True}  # tokenizer_config.json
    assert add_special_flags(files(template, flags), tokens, ids, default_bos=True) == (False, True)


def test_cli_offers_every_output_type() -> None:
    from outpost.cli import build_parser
    from outpost.models.convert.tensors import OUTTYPES

    args = build_parser().parse_args(["convert", "some/model"])
    assert args.outtype == "f16"
    for outtype in OUTTYPES:
        assert build_parser().parse_args(["convert", "x", "--outtype", outtype]).outtype == outtype
