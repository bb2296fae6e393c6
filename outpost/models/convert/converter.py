"""`convert_model`: a Hugging Face model (folder or repo id) to one GGUF file, streamed and atomic.

Owns the order of work: resolve the source, read config -> hparams -> tensor plan -> vocabulary
(all cheap, and every input error surfaces before a byte is written), then write the GGUF to a
hidden temporary name beside the output, tensor by tensor, and rename it into place only when
complete. Nothing here imports llama_cpp: the output is checked by loading it in the tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from gguf import GGML_QUANT_VERSION, GGUFWriter, LlamaFileType

from outpost.models.convert.archs import ArchSpec, arch_for, validate, write_hparams
from outpost.models.convert.hparams import HParams, parse_hparams
from outpost.models.convert.source import resolve_source
from outpost.models.convert.st_reader import open_checkpoint
from outpost.models.convert.tensors import OUTTYPES, StreamedTensor, TensorJob, plan_tensors
from outpost.models.convert.vocab import load_vocab, write_vocab
from outpost.models.convert.vocab_parts import GGUFVocab, read_json
from outpost.models.files import temp_path_beside

ProgressFn = Callable[[int, int, str], None]
"""progress(done, total, label): one step per tensor written."""

_FILE_TYPES = {
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
}


def default_output(src: str, outtype: str) -> Path:
    """NAME-OUTTYPE.gguf in the working directory, NAME being the folder or repo name."""
    name = Path(src.rstrip("/")).name or "model"
    return Path.cwd() / f"{name}-{outtype}.gguf"


def _write_general(writer: GGUFWriter, name: str, outtype: str, repo_id: str | None) -> None:
    writer.add_type("model")
    writer.add_name(name)
    writer.add_file_type(_FILE_TYPES[outtype])
    writer.add_quantization_version(GGML_QUANT_VERSION)
    if repo_id:
        writer.add_string("general.source.huggingface.repository", repo_id)


def _write_gguf(
    path: Path,
    spec: ArchSpec,
    hp: HParams,
    vocab: GGUFVocab,
    jobs: list[TensorJob],
    progress: ProgressFn | None,
    *,
    name: str,
    outtype: str,
    repo_id: str | None,
) -> None:
    writer = GGUFWriter(path, spec.gguf_name)
    try:
        _write_general(writer, name, outtype, repo_id)
        write_hparams(writer, spec, hp, len(vocab.tokens))
        write_vocab(writer, vocab)
        for job in jobs:
            # Logical (not byte) shape with raw_dtype: the writer records the type as given.
            writer.add_tensor_info(job.name, job.shape, np.dtype(np.float32), job.nbytes, raw_dtype=job.qtype)
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for index, job in enumerate(jobs):
            writer.write_tensor_data(cast(Any, StreamedTensor(job)))
            if progress is not None:
                progress(index + 1, len(jobs), job.name)
    finally:
        writer.close()


def convert_model(
    src: str,
    out_path: Path | None = None,
    outtype: str = "f16",
    pre_tokenizer: str | None = None,
    progress: ProgressFn | None = None,
) -> Path:
    """Convert `src` (a local HF model folder, or a Hugging Face repo id) to a GGUF at `out_path`.

    outtype is f32, f16, bf16 or q8_0 (1-D tensors always stay f32). `pre_tokenizer` overrides the
    llama.cpp pre-tokenizer chosen from tokenizer.json. Raises ValueError / FileNotFoundError for
    bad input; the output file appears only when complete.
    """
    if outtype not in OUTTYPES:
        raise ValueError(f"unknown --outtype {outtype!r}; choose one of: {', '.join(OUTTYPES)}")
    model_dir, repo_id = resolve_source(src)
    out = Path(out_path) if out_path is not None else default_output(src, outtype)
    if out.is_dir():
        raise ValueError(f"output {out} is a directory; give a file name ending in .gguf")
    config = read_json(model_dir / "config.json")
    spec = arch_for(config)
    hp = parse_hparams(config, spec.tied_default)
    validate(spec, hp)
    jobs = plan_tensors(open_checkpoint(model_dir), spec, hp, outtype)
    n_rows = next(job.shape[0] for job in jobs if job.name == "token_embd.weight")
    vocab = load_vocab(model_dir, config, n_rows, pre_tokenizer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_beside(out)
    name = (repo_id or model_dir.name).split("/")[-1]
    try:
        _write_gguf(tmp, spec, hp, vocab, jobs, progress, name=name, outtype=outtype, repo_id=repo_id)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
