"""`outpost convert` as a user runs it: exit codes, one-line errors, atomic output, repo ids.

The model here is built without torch (numpy weights written as bf16 safetensors, a BPE trained
with `tokenizers`), so these run wherever Outpost's runtime dependencies are installed; the
numerical checks against transformers are in test_convert_archs.py.
"""

from __future__ import annotations

import json
import shutil
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from outpost.cli import main
from outpost.engine.config import EngineConfig
from outpost.engine.model import LoadedModel

HIDDEN, LAYERS, HEADS, KV_HEADS, FF = 64, 2, 4, 2, 128
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _bf16(values: np.ndarray) -> np.ndarray:
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    header: dict[str, Any] = {}
    offset = 0
    for name, values in tensors.items():
        size = values.size * 2
        header[name] = {"dtype": "BF16", "shape": list(values.shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for values in tensors.values():
            f.write(_bf16(values).tobytes())


def _weights(n_vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    kv = KV_HEADS * HIDDEN // HEADS
    tensors = {"model.embed_tokens.weight": rng.normal(0, 0.4, (n_vocab, HIDDEN))}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes = {
            "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
            "self_attn.k_proj.weight": (kv, HIDDEN),
            "self_attn.v_proj.weight": (kv, HIDDEN),
            "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            "mlp.gate_proj.weight": (FF, HIDDEN),
            "mlp.up_proj.weight": (FF, HIDDEN),
            "mlp.down_proj.weight": (HIDDEN, FF),
        }
        tensors |= {p + name: rng.normal(0, 0.1, shape) for name, shape in shapes.items()}
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN)
    tensors["model.norm.weight"] = np.ones(HIDDEN)
    return tensors


def _tokenizer(out: Path, pre_tokenizer: Any = None) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from outpost.models.corpus import load_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer or pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(load_corpus()[0].splitlines()[:2000], trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "chat_template": TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return int(tok.get_vocab_size())


def make_model_dir(out: Path, pre_tokenizer: Any = None, architecture: str = "LlamaForCausalLM") -> Path:
    """A tiny HF llama folder (bf16 safetensors) written without torch."""
    out.mkdir(parents=True)
    n_vocab = _tokenizer(out, pre_tokenizer) + 3
    config = {
        "architectures": [architecture],
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": FF,
        "vocab_size": n_vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (out / "config.json").write_text(json.dumps(config))
    _write_safetensors(out / "model.safetensors", _weights(n_vocab))
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model_dir(tmp_path_factory.mktemp("convert-cli") / "tiny-llama")


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith("outpost: error: ")
    return err[0]


@pytest.mark.parametrize("outtype", ["f32", "f16", "bf16", "q8_0"])
def test_convert_writes_a_model_llama_cpp_loads(
    model_dir: Path, tmp_path: Path, outtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / f"tiny-{outtype}.gguf"
    assert main(["convert", str(model_dir), "--outtype", outtype, "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left behind
    with LoadedModel(EngineConfig(model_path=str(out), n_ctx=128, n_seq_max=1)) as model:
        assert model.describe()["architecture"] == "llama"
        assert model.metadata("tokenizer.ggml.pre") == "gpt-2"
        assert model.metadata("tokenizer.chat_template") == TEMPLATE
        assert model.vocab.eos_text == "<|im_end|>"
        assert model.vocab.detokenize(model.vocab.tokenize("Hello world", add_special=False)) == "Hello world"


def test_unsupported_architecture_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = make_model_dir(tmp_path / "neox", architecture="GPTNeoXForCausalLM")
    assert main(["convert", str(src), "-o", str(tmp_path / "x.gguf")]) == 2
    line = _error_line(capsys)
    assert "GPTNeoXForCausalLM is not supported" in line and "Qwen3ForCausalLM" in line
    assert not (tmp_path / "x.gguf").exists()


def test_bad_sources_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", str(tmp_path / "missing" / "dir"), "-o", str(tmp_path / "x.gguf")]) == 2
    assert "no such directory" in _error_line(capsys)
    a_file = tmp_path / "model.bin"
    a_file.write_bytes(b"x")
    assert main(["convert", str(a_file), "-o", str(tmp_path / "x.gguf")]) == 2
    assert "not a directory" in _error_line(capsys)
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(tmp_path), "--outtype", "q4_0"])
    assert exit_info.value.code == 2


def test_unknown_pre_tokenizer_names_it_and_override_converts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tokenizers import Regex, pre_tokenizers

    custom = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{L}+|\p{N}{1,2}"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    src = make_model_dir(tmp_path / "custom", pre_tokenizer=custom)
    out = tmp_path / "custom.gguf"
    assert main(["convert", str(src), "-o", str(out)]) == 2
    line = _error_line(capsys)
    assert r"\p{L}+|\p{N}{1,2}" in line and "--pre-tokenizer" in line
    assert main(["convert", str(src), "-o", str(out), "--pre-tokenizer", "qwen2"]) == 0
    with LoadedModel(EngineConfig(model_path=str(out), n_ctx=128, n_seq_max=1)) as model:
        assert model.metadata("tokenizer.ggml.pre") == "qwen2"


def test_truncated_checkpoint_is_refused_before_writing(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a cut-off download
    out_dir = tmp_path / "out"
    assert main(["convert", str(broken), "-o", str(out_dir / "x.gguf")]) == 2
    assert "truncated" in _error_line(capsys)
    assert not out_dir.exists() or list(out_dir.iterdir()) == []


class _NoReposHub(BaseHTTPRequestHandler):
    """Answers every request as the Hub does for a repository that does not exist."""

    def do_GET(self) -> None:
        body = b'{"error": "Repository not found"}'
        self.send_response(404)
        self.send_header("X-Error-Code", "RepoNotFound")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def empty_hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoReposHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    yield url
    server.shutdown()


def test_unknown_repo_id_is_exit_2(
    empty_hub: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["convert", "nobody/no-such-model", "-o", str(tmp_path / "x.gguf")]) == 2
    assert "no model repo nobody/no-such-model" in _error_line(capsys)


def test_repo_id_downloads_what_conversion_reads(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    calls: list[dict[str, Any]] = []

    def fake_snapshot_download(repo_id: str, **kwargs: Any) -> str:
        calls.append({"repo_id": repo_id, **kwargs})
        return str(model_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    out = tmp_path / "from-hub.gguf"
    assert main(["convert", "someone/tiny-llama", "--outtype", "q8_0", "-o", str(out)]) == 0
    (call,) = calls
    assert call["repo_id"] == "someone/tiny-llama" and call["endpoint"] == "http://127.0.0.1:9"
    assert {"config.json", "tokenizer.json", "tokenizer.model", "model*.safetensors"} <= set(
        call["allow_patterns"]
    )
    with LoadedModel(EngineConfig(model_path=str(out), n_ctx=128, n_seq_max=1)) as model:
        assert model.metadata("general.source.huggingface.repository") == "someone/tiny-llama"
        assert model.metadata("general.name") == "tiny-llama"


def test_failure_while_writing_keeps_the_old_file_and_no_temp(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from outpost.models.convert import tensors

    out = tmp_path / "model.gguf"
    out.write_bytes(b"previous model")
    written: list[str] = []
    real_tofile = tensors.StreamedTensor.tofile

    def failing_tofile(self: tensors.StreamedTensor, fp: Any) -> None:
        if len(written) == 5:
            raise OSError("No space left on device")
        written.append(self.job.name)
        real_tofile(self, fp)

    monkeypatch.setattr(tensors.StreamedTensor, "tofile", failing_tofile)
    assert main(["convert", str(model_dir), "-o", str(out)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    assert out.read_bytes() == b"previous model"
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]
