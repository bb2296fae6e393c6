"""LoRA adapter GGUFs (llama.cpp's format): checking one against its base model, writing one for a
synthetic model.

The format, as llama.cpp's llama-adapter.cpp reads it: `general.type` "adapter",
`general.architecture` the base model's, `adapter.type` "lora", `adapter.lora.alpha`, and for each
adapted weight W (numpy shape (rows, cols)) a pair `W.lora_a` (r, cols) and `W.lora_b` (rows, r).
llama.cpp adds `scale * alpha / r * B @ A` to W's product (`scale` alone where alpha is 0). The check
reads headers only (no llama.cpp), so `serve` and `worker` refuse a wrong file before they start.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

from outpost.models.files import temp_path_beside
from outpost.models.shapes import get_shape
from outpost.models.synth import finish_small_gguf, tensor_specs
from outpost.sizing.footprint import Tensor, read_header

DEFAULT_TARGETS = ("output.weight",)


def check_lora_adapter(adapter: str, model: str) -> None:
    """ValueError, in one line, if `adapter` is not a LoRA GGUF llama.cpp can load for `model`."""
    meta, tensors = read_header(Path(adapter))
    kinds = (meta.get("general.type"), meta.get("adapter.type"))
    if kinds != ("adapter", "lora"):
        raise ValueError(
            f"--lora {adapter} is not a LoRA adapter GGUF (general.type {kinds[0]!r}, "
            f"adapter.type {kinds[1]!r}; want 'adapter', 'lora')"
        )
    base_meta, base = read_header(Path(model))
    arch, base_arch = meta.get("general.architecture"), base_meta.get("general.architecture")
    if arch != base_arch:
        raise ValueError(f"--lora {adapter} is for architecture {arch!r}, the model {model} is {base_arch!r}")
    names = {
        n.removesuffix(".lora_a").removesuffix(".lora_b")
        for n in tensors
        if n.endswith((".lora_a", ".lora_b"))
    }
    if not names:
        raise ValueError(f"--lora {adapter} has no .lora_a/.lora_b tensors")
    for name in sorted(names):
        problem = _pair_problem(
            name, tensors.get(f"{name}.lora_a"), tensors.get(f"{name}.lora_b"), base.get(name)
        )
        if problem:
            raise ValueError(f"--lora {adapter} does not fit {model}: {problem}")


def _pair_problem(name: str, a: Tensor | None, b: Tensor | None, w: Tensor | None) -> str | None:
    """What llama.cpp would refuse in one adapted weight's pair (ggml order: dims[0] is a row)."""
    if a is None or b is None:
        return f"{name} has only one of lora_a and lora_b"
    if w is None:
        return f"the model has no tensor {name}"
    if len(a.dims) != 2 or len(b.dims) != 2 or len(w.dims) != 2:
        return f"{name}'s LoRA pair is not two matrices for a matrix"
    if name == "token_embd.weight":  # llama.cpp flips A and B for the embedding lookup
        fits = w.dims[0] == b.dims[1] and w.dims[1] == a.dims[1]
    else:
        fits = w.dims[0] == a.dims[0] and w.dims[1] == b.dims[1] and a.dims[1] == b.dims[0]
    if not fits:
        return f"{name} is {w.dims} but its lora_a is {a.dims} and lora_b {b.dims} (another base model?)"
    return None


def lora_matrices(shape: str, rank: int, targets: Sequence[str], seed: int) -> dict[str, np.ndarray]:
    """The A (r, cols) and B (rows, r) of each target weight of a synthetic `shape`, f32, seeded.

    Entries are standard normal: B @ A then has entries of about sqrt(r), beside the synthetic
    output matrix's 1, so scale 1 (alpha = r) visibly moves the logits."""
    dims = {spec.name: spec.dims for spec in tensor_specs(get_shape(shape)) if len(spec.dims) == 2}
    out: dict[str, np.ndarray] = {}
    for i, name in enumerate(targets):
        if name not in dims:
            raise ValueError(f"--lora-target {name!r} is not a matrix of shape {shape} ({', '.join(dims)})")
        rows, cols = dims[name]
        rng = np.random.default_rng([seed, i])
        out[f"{name}.lora_a"] = rng.standard_normal((rank, cols), dtype=np.float32)
        out[f"{name}.lora_b"] = rng.standard_normal((rows, rank), dtype=np.float32)
    return out


def write_lora_adapter(
    shape: str,
    out_path: Path,
    rank: int = 4,
    alpha: float | None = None,
    targets: Sequence[str] = DEFAULT_TARGETS,
    seed: int = 0,
) -> Path:
    """Write a LoRA adapter GGUF for the synthetic model of `shape` (alpha: default the rank, so
    llama.cpp's alpha / r is 1). The file appears only when complete."""
    if rank < 1:
        raise ValueError(f"--lora-rank must be at least 1 (got {rank})")
    model = get_shape(shape)
    tensors = lora_matrices(shape, rank, targets, seed)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_beside(out_path, "lora")
    try:
        writer = GGUFWriter(tmp, model.arch)
        writer.add_type("adapter")
        writer.add_name(f"outpost-synthetic-{shape}-lora")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", float(rank if alpha is None else alpha))
        finish_small_gguf(writer, tensors.items(), tmp, out_path)
    finally:
        tmp.unlink(missing_ok=True)
    return out_path
