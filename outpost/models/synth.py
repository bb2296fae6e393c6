"""Writing synthetic random-weight GGUF models in a named shape (see shapes.py).

The file is complete and loadable by llama.cpp: real tokenizer and chat template (tokenizer.py),
every hyperparameter key the llama/qwen2 loaders read, f32 norms and f16 matrices drawn from a
seeded generator, so the same (shape, quant, seed) always gives the same bytes. Tensors are
generated and written in row chunks, never all at once, so memory stays at a few hundred MB even for
multi-GB models. Quantized outputs go through llama.cpp's own quantizer (outpost.engine.quantize).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
from gguf import GGUFWriter, LlamaFileType

from outpost.models.files import temp_path_beside
from outpost.models.shapes import ModelShape, get_shape
from outpost.models.tokenizer import Vocab, add_tokenizer_metadata, build_vocab

ProgressFn = Callable[[int, int, str], None]
"""progress(done_steps, total_steps, label): one step per tensor written (and per tensor quantized)."""

QUANTS = ("f16", "q8_0", "q4_0", "q4_K_M")
# Output-matrix rows (token_embd when tied) of control tokens and invisible bytes are shrunk so their
# logits sit near zero, far below the top of a peaked distribution: random models then never emit EOS
# or unprintable bytes (generation ends on max_tokens or stop strings). With tied embeddings inputs
# still work, because RMSNorm rescales the shrunken rows.
HIDDEN_ROW_SCALE = 0.01
NORM_NOISE_STD = 0.02
_CHUNK_ELEMS = 1 << 22  # rows are generated ~16 MB (f32) at a time


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: GGUF name, numpy shape (rows, cols) or (n,), and how to fill it."""

    name: str
    dims: tuple[int, ...]
    kind: str  # "embd" | "qk" | "matrix" | "output" | "norm" | "bias"

    @property
    def dtype(self) -> type[np.floating[Any]]:
        return np.float16 if len(self.dims) == 2 else np.float32  # 1-D tensors stay f32 (as llama.cpp)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.dims)) * np.dtype(self.dtype).itemsize


def tensor_specs(shape: ModelShape) -> list[TensorSpec]:
    """All tensors of the model, in file order, with llama.cpp's names and numpy-order shapes."""
    d, q, kv, ff = shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim, shape.n_ff
    specs = [TensorSpec("token_embd.weight", (shape.n_vocab, d), "embd")]
    for i in range(shape.n_layer):
        blk = f"blk.{i}"
        specs += [
            TensorSpec(f"{blk}.attn_norm.weight", (d,), "norm"),
            TensorSpec(f"{blk}.attn_q.weight", (q, d), "qk"),
            TensorSpec(f"{blk}.attn_k.weight", (kv, d), "qk"),
            TensorSpec(f"{blk}.attn_v.weight", (kv, d), "matrix"),
        ]
        if shape.qkv_bias:
            biases = (("q", q), ("k", kv), ("v", kv))
            specs += [TensorSpec(f"{blk}.attn_{x}.bias", (n,), "bias") for x, n in biases]
        specs += [
            TensorSpec(f"{blk}.attn_output.weight", (d, q), "matrix"),
            TensorSpec(f"{blk}.ffn_norm.weight", (d,), "norm"),
            TensorSpec(f"{blk}.ffn_gate.weight", (ff, d), "matrix"),
            TensorSpec(f"{blk}.ffn_up.weight", (ff, d), "matrix"),
            TensorSpec(f"{blk}.ffn_down.weight", (d, ff), "matrix"),
        ]
    specs.append(TensorSpec("output_norm.weight", (d,), "norm"))
    if not shape.tied_embeddings:
        specs.append(TensorSpec("output.weight", (shape.n_vocab, d), "output"))
    return specs


class _GeneratedTensor:
    """Quacks like the ndarray GGUFWriter.write_tensor_data wants (nbytes, tofile) but produces the
    data chunk by chunk, so a 400 MB embedding never exists in memory at once."""

    def __init__(
        self, spec: TensorSpec, shape: ModelShape, seed: int, index: int, hidden: np.ndarray[Any, Any]
    ) -> None:
        self.spec, self.shape, self.hidden = spec, shape, hidden
        self.nbytes = spec.nbytes
        # One independent stream per tensor: adding a tensor never shifts the others' values.
        self.rng = np.random.default_rng([seed, index])

    def tofile(self, fp: IO[bytes]) -> None:
        spec = self.spec
        if len(spec.dims) == 1:
            noise = self.rng.standard_normal(spec.dims[0], dtype=np.float32)
            base = 1.0 if spec.kind == "norm" else 0.0
            std = NORM_NOISE_STD if spec.kind == "norm" else self.shape.weight_std
            (base + std * noise).astype(np.float32).tofile(fp)
            return
        rows, cols = spec.dims
        stds = {"embd": self.shape.embd_std, "qk": self.shape.qk_std, "output": self.shape.out_std}
        std = stds.get(spec.kind, self.shape.weight_std)
        step = max(1, _CHUNK_ELEMS // cols)
        for r0 in range(0, rows, step):
            block = self.rng.standard_normal((min(step, rows - r0), cols), dtype=np.float32)
            block *= std
            if spec.kind == ("embd" if self.shape.tied_embeddings else "output"):
                local = self.hidden[(self.hidden >= r0) & (self.hidden < r0 + len(block))] - r0
                block[local] *= HIDDEN_ROW_SCALE
            block.astype(np.float16).tofile(fp)


def _add_hparams(writer: GGUFWriter, shape: ModelShape, seed: int) -> None:
    """general.* and <arch>.* keys, the ones llama.cpp's llama/qwen2 loaders read."""
    writer.add_type("model")
    writer.add_name(f"outpost-synthetic-{shape.name}")
    writer.add_description("Random weights in the shape of a real model; not a trained model.")
    writer.add_file_type(LlamaFileType.MOSTLY_F16)
    writer.add_vocab_size(shape.n_vocab)
    writer.add_context_length(shape.n_ctx_train)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_string("outpost.synthetic.shape", shape.name)
    writer.add_uint32("outpost.synthetic.seed", seed)


def write_f16_gguf(
    shape: ModelShape,
    path: Path,
    seed: int,
    vocab: Vocab,
    progress: ProgressFn | None = None,
    total_steps: int | None = None,
    with_tensors: bool = True,
) -> None:
    """Stream the whole model to `path` (not atomic: callers write to a temporary name)."""
    specs = tensor_specs(shape) if with_tensors else []
    total = total_steps or len(specs)
    hidden = np.asarray(vocab.hidden_ids(), dtype=np.int64)
    writer = GGUFWriter(path, shape.arch)
    _add_hparams(writer, shape, seed)
    add_tokenizer_metadata(writer, vocab)
    for spec in specs:
        writer.add_tensor_info(spec.name, spec.dims, np.dtype(spec.dtype), spec.nbytes)
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, spec in enumerate(specs):
            writer.write_tensor_data(cast(Any, _GeneratedTensor(spec, shape, seed, index, hidden)))
            if progress is not None:
                progress(index + 1, total, spec.name)
    finally:
        writer.close()


def finish_small_gguf(
    writer: GGUFWriter, tensors: Iterable[tuple[str, Any]], tmp: Path, out_path: Path
) -> None:
    """Adds in-memory `tensors` to `writer` (its metadata added, writing to `tmp`), writes the file
    and renames it to `out_path`: a small GGUF (reranker, LoRA adapter) whole, then atomically."""
    for name, data in tensors:
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out_path)


def write_vocab_only_gguf(shape: str, out_path: Path) -> Path:
    """Write just the metadata and tokenizer of a shape (no tensors): enough for llama.cpp's
    vocab_only loading, i.e. tokenizer and chat-template tests, in a fraction of a second."""
    model = get_shape(shape)
    out_path = Path(out_path)
    tmp = temp_path_beside(out_path, "vocab")
    try:
        write_f16_gguf(model, tmp, 0, build_vocab(model.n_vocab), with_tensors=False)
        os.replace(tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path


def _quantize(src: Path, dst: Path, quant: str, progress: ProgressFn | None, n_tensors: int) -> None:
    """Run llama.cpp's quantizer, reporting its tensors as steps n_tensors+1 .. 2*n_tensors."""
    from outpost.engine.quantize import quantize_gguf  # the only llama.cpp dependency of this package

    def on_tensor(done: int, _total: int, name: str) -> None:
        if progress is not None:
            progress(n_tensors + min(done, n_tensors), 2 * n_tensors, f"{quant} {name}")

    quantize_gguf(src, dst, quant, progress=on_tensor)
    if progress is not None:
        progress(2 * n_tensors, 2 * n_tensors, f"quantized to {quant}")


def write_synthetic_model(
    shape: str, out_path: Path, quant: str = "f16", seed: int = 0, progress: ProgressFn | None = None
) -> Path:
    """Write a random-weight GGUF of the named shape to `out_path` and return the path.

    quant is one of QUANTS; anything but f16 writes f16 to a temporary file next to the output and
    runs llama.cpp's quantizer on it. The output appears only when complete (atomic rename).
    """
    model = get_shape(shape)
    quant = {q.lower(): q for q in QUANTS}.get(quant.lower(), quant)
    if quant not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}; choose one of: {', '.join(QUANTS)}")
    if not 0 <= seed < 2**32:
        raise ValueError("seed must fit in 32 bits")
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    vocab = build_vocab(model.n_vocab)
    n_tensors = len(tensor_specs(model))
    # One progress step per tensor written, and (quantized outputs) one per tensor quantized.
    n_steps = n_tensors * (1 if quant == "f16" else 2)
    tmp_f16, tmp_out = temp_path_beside(out_path, "f16"), temp_path_beside(out_path, quant)
    try:
        write_f16_gguf(model, tmp_f16, seed, vocab, progress, n_steps)
        if quant != "f16":
            _quantize(tmp_f16, tmp_out, quant, progress, n_tensors)
        os.replace(tmp_f16 if quant == "f16" else tmp_out, out_path)
    finally:
        tmp_f16.unlink(missing_ok=True)
        tmp_out.unlink(missing_ok=True)
    return out_path
