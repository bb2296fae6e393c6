"""Synthetic GGUF models: written files load in llama.cpp, carry the right metadata, are reproducible.

Only the `tiny` shape is written here (the larger shapes take seconds to minutes and GBs of disk).
Quantized files are decoded one token per batch: llama.cpp's AMX kernels crash on batched q8_0/q4_0
matmuls on some Xeons (llama.cpp issue #20824), which is not what these tests are about.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader, LlamaFileType

from outpost.models import SHAPES, demo_model_path, ensure_demo_model, write_synthetic_model
from outpost.models.synth import tensor_specs
from outpost.models.tokenizer import CHAT_TEMPLATE, build_vocab

llama_cpp = pytest.importorskip("llama_cpp")

PROMPT = (
    "The small town sat at the edge of a wide valley, where the river turned slowly toward the sea. "
    "Every morning the baker opened his shop before sunrise, and the smell of fresh bread drifted down "
    "the empty street while children walked to school in pairs."
)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("quant")
    return {q: write_synthetic_model("tiny", out / f"tiny-{q}.gguf", quant=q) for q in ("q8_0", "q4_0")}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _fields(path: Path) -> dict[str, object]:
    reader = GGUFReader(path)
    return {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}


def _logits(path: Path, tokens: list[int], n_batch: int) -> np.ndarray:
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=256, n_batch=n_batch, n_ubatch=n_batch, logits_all=True, verbose=False
    )
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)])


def _prompt_tokens(path: Path) -> list[int]:
    vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    return list(vocab.tokenize(PROMPT.encode(), add_bos=False))


def test_tiny_metadata(tiny_model: Path) -> None:
    shape = SHAPES["tiny"]
    fields = _fields(tiny_model)
    expected = {
        "general.architecture": "llama",
        "general.name": "outpost-synthetic-tiny",
        "general.file_type": int(LlamaFileType.MOSTLY_F16),
        "llama.context_length": shape.n_ctx_train,
        "llama.embedding_length": 256,
        "llama.block_count": 4,
        "llama.feed_forward_length": 768,
        "llama.attention.head_count": 4,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 64,
        "llama.vocab_size": 8192,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.eot_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    assert {k: fields.get(k) for k in expected} == expected
    assert fields["llama.rope.freq_base"] == pytest.approx(1e5)
    assert fields["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)
    vocab = build_vocab(8192)
    assert fields["tokenizer.ggml.tokens"] == list(vocab.tokens)
    assert fields["tokenizer.ggml.merges"] == list(vocab.merges)


def test_tiny_tensors_are_f16_matrices_and_f32_norms(tiny_model: Path) -> None:
    tensors = GGUFReader(tiny_model).tensors
    assert [t.name for t in tensors] == [s.name for s in tensor_specs(SHAPES["tiny"])]
    for t in tensors:
        two_d = len(t.data.shape) == 2
        assert t.tensor_type == (GGMLQuantizationType.F16 if two_d else GGMLQuantizationType.F32)
        if t.name.endswith("norm.weight"):
            assert abs(float(np.mean(t.data)) - 1.0) < 0.01
    assert 5 << 20 < tiny_model.stat().st_size < 25 << 20  # a few MB


def test_tiny_runs_in_llama_cpp_with_peaked_logits(tiny_model: Path) -> None:
    tokens = _prompt_tokens(tiny_model)
    batched = _logits(tiny_model, tokens, n_batch=64)
    one_by_one = _logits(tiny_model, tokens, n_batch=1)
    top2 = np.sort(batched, axis=1)[:, -2:]
    margins = top2[:, 1] - top2[:, 0]
    print(f"logit std {batched.std(axis=1).mean():.1f}, margin median {np.median(margins):.2f}")
    assert np.isfinite(batched).all()
    assert np.median(margins) > 1.0
    assert np.abs(batched - one_by_one).max() < 0.1
    clear = margins > 0.5
    assert (batched.argmax(1) == one_by_one.argmax(1))[clear].all()
    # Control tokens and invisible bytes are never the argmax: random models do not stop on EOS.
    hidden = set(build_vocab(8192).hidden_ids())
    assert not hidden & set(batched.argmax(1).tolist())


def test_tiny_greedy_output_is_varied_text(tiny_model: Path) -> None:
    llm = llama_cpp.Llama(model_path=str(tiny_model), n_ctx=256, verbose=False)
    text = llm.create_completion(PROMPT, max_tokens=40, temperature=0.0)["choices"][0]["text"]
    tokens = llm.tokenize(text.encode(), add_bos=False)
    assert len(set(tokens)) > 20 and text.isprintable()


@pytest.mark.parametrize("quant", ["q8_0", "q4_0"])
def test_quantized_tiny_loads(quantized: dict[str, Path], tiny_model: Path, quant: str) -> None:
    path = quantized[quant]
    ftype = {"q8_0": LlamaFileType.MOSTLY_Q8_0, "q4_0": LlamaFileType.MOSTLY_Q4_0}[quant]
    fields = _fields(path)
    assert fields["general.file_type"] == int(ftype)
    assert fields["tokenizer.chat_template"] == CHAT_TEMPLATE
    assert path.stat().st_size < tiny_model.stat().st_size * 0.6
    tokens = _prompt_tokens(path)[:12]
    logits = _logits(path, tokens, n_batch=1)
    reference = _logits(tiny_model, tokens, n_batch=1)
    assert np.isfinite(logits).all()
    assert np.corrcoef(logits.ravel(), reference.ravel())[0, 1] > 0.95
    assert not list(path.parent.glob(".*.tmp"))


def test_same_seed_gives_identical_bytes_across_processes(
    tiny_model: Path, quantized: dict[str, Path], tmp_path: Path
) -> None:
    again = tmp_path / "again.gguf"
    code = (
        "import sys; from pathlib import Path; from outpost.models import write_synthetic_model; "
        "write_synthetic_model('tiny', Path(sys.argv[1]), quant='f16', seed=0)"
    )
    subprocess.run([sys.executable, "-c", code, str(again)], check=True, timeout=120)
    assert _sha256(again) == _sha256(tiny_model)
    q8 = write_synthetic_model("tiny", tmp_path / "q8.gguf", quant="Q8_0")  # llama.cpp's quantizer too
    assert _sha256(q8) == _sha256(quantized["q8_0"])
    other = write_synthetic_model("tiny", tmp_path / "seed1.gguf", seed=1)
    assert _sha256(other) != _sha256(tiny_model)


def test_progress_reaches_total_and_failures_leave_no_file(tmp_path: Path) -> None:
    calls: list[tuple[int, int, str]] = []
    write_synthetic_model("tiny", tmp_path / "p.gguf", progress=lambda d, t, n: calls.append((d, t, n)))
    done = [d for d, _, _ in calls]
    assert done == sorted(done) and calls[-1][0] == calls[-1][1] == len(tensor_specs(SHAPES["tiny"]))

    def explode(done: int, total: int, name: str) -> None:
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_synthetic_model("tiny", tmp_path / "broken.gguf", progress=explode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.gguf"]


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="smollm2-135m"):
        write_synthetic_model("gpt-5", tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="q4_K_M"):
        write_synthetic_model("tiny", tmp_path / "x.gguf", quant="q3_weird")
    assert not list(tmp_path.iterdir())


def test_demo_model_is_generated_once_under_outpost_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OUTPOST_HOME", str(tmp_path / "home"))
    path = ensure_demo_model()
    assert path == demo_model_path() and path.is_relative_to(tmp_path / "home")
    stamp = path.stat().st_mtime_ns
    assert ensure_demo_model() == path and path.stat().st_mtime_ns == stamp
    assert _fields(path)["outpost.synthetic.shape"] == "tiny"
    assert os.listdir(path.parent) == [path.name]
