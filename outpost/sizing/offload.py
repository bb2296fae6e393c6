"""How many layers go to the GPU (`-ngl`, `auto` included) and what that puts in GPU memory; pure.

llama.cpp's rule (llama-model.cpp, `load_tensors`): with `n_gpu_layers` = k and at least one GPU
device, the *last* k of the n_layer + 1 layers go to the GPU, the output layer (output.weight, or
the tied token embedding copied for it, and output_norm) being the last one; the input embedding
always stays on the CPU. Each offloaded layer keeps its KV cache on its device (offload_kqv, the
default), and the compute buffer for the GPU's part of the graph lives there too. A build without
a GPU device (the CPU wheel) offloads nothing, whatever -ngl says.

The free memory of each GPU comes from llama.cpp's own device list (outpost/engine/devices.py),
read before the model loads; the CUDA context is already made by then, so what is left for the
allocator is what `free` reads, less GPU_RESERVE_BYTES and GPU_SAFETY_SHARE of it. `-ngl auto`
offloads the most layers whose weights, compute buffers and a short context's KV cache fit;
`-c auto` then gives the KV cache what the offloaded layers leave (sizing/plan.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from outpost.sizing.footprint import ModelFootprint

MiB = 1024**2
ALL_LAYERS = -1  # what EngineConfig.n_gpu_layers takes for "every layer" (llama.cpp: any k > n_layer)
GPU_RESERVE_BYTES = 256 * MiB  # cuBLAS workspace, CUDA graphs and the allocator's pools
GPU_SAFETY_SHARE = 0.05  # and 5% of the free memory, for fragmentation and other processes


@dataclass(frozen=True)
class Gpu:
    """One GPU as llama.cpp lists it: its name, description and memory in bytes."""

    name: str
    description: str
    free: int
    total: int


@dataclass(frozen=True)
class Offload:
    """Which layers run on the GPUs: `layers` of the model's n_layer + 1 (the output layer first)."""

    layers: int
    n_layer: int
    gpus: tuple[Gpu, ...]
    weight_bytes: int  # weights that live in GPU memory

    @property
    def repeating(self) -> int:
        """Transformer blocks on the GPU (each with its share of the KV cache)."""
        return max(0, min(self.layers - 1, self.n_layer))

    @property
    def all_layers(self) -> bool:
        return self.layers > self.n_layer

    @property
    def n_gpu_layers(self) -> int:
        """What llama.cpp gets: ALL_LAYERS when every layer is offloaded."""
        return ALL_LAYERS if self.all_layers else self.layers

    @property
    def kv_share(self) -> float:
        """The part of every KV cell that lives in GPU memory."""
        return self.repeating / self.n_layer if self.n_layer else 0.0

    @property
    def free(self) -> int:
        return sum(g.free for g in self.gpus)

    @property
    def room(self) -> int:
        """GPU bytes the weights, compute buffers and KV cache may take."""
        return max(0, int(self.free * (1 - GPU_SAFETY_SHARE)) - GPU_RESERVE_BYTES * len(self.gpus))

    def describe(self) -> str:
        names = ", ".join(sorted({g.description or g.name for g in self.gpus}))
        return f"{self.repeating}/{self.n_layer} layers{' + output' if self.layers else ''} on {names}"


def offloadable(gpus: tuple[Gpu, ...], split_mode: str, main_gpu: int) -> tuple[Gpu, ...]:
    """The GPUs llama.cpp spreads layers over: all of them, or only `main_gpu` with -sm none."""
    if split_mode == "none" and gpus:
        return (gpus[min(main_gpu, len(gpus) - 1)],)
    return gpus


def _layer_bytes(model: ModelFootprint) -> tuple[int, ...]:
    """Each block's weight bytes; an even share of the file where the header was not walked."""
    if len(model.layer_bytes) == model.n_layer:
        return model.layer_bytes
    return (model.file_bytes // (model.n_layer + 1),) * model.n_layer


def gpu_weight_bytes(model: ModelFootprint, layers: int) -> int:
    """Weight bytes on the GPU with `layers` offloaded: the output layer, then the last blocks."""
    if layers <= 0:
        return 0
    blocks = _layer_bytes(model)
    repeating = min(layers - 1, model.n_layer)
    output = model.output_bytes or (model.file_bytes // (model.n_layer + 1))
    return output + sum(blocks[model.n_layer - repeating :])


def offload_for(model: ModelFootprint, gpus: tuple[Gpu, ...], layers: int) -> Offload:
    """The offload `layers` (ALL_LAYERS or more than n_layer: all) makes; none without a GPU."""
    if not gpus:
        layers = 0
    elif layers < 0 or layers > model.n_layer:
        layers = model.n_layer + 1
    return Offload(layers, model.n_layer, gpus, gpu_weight_bytes(model, layers))


def auto_layers(
    model: ModelFootprint, gpus: tuple[Gpu, ...], other_bytes: int, kv_cells: int, cell: int
) -> int:
    """The most layers (0 .. n_layer + 1) whose weights, plus `other_bytes` (compute buffers) and
    their share of `kv_cells` cells of `cell` bytes each, fit the GPUs' room."""
    best = 0
    for layers in range(1, model.n_layer + 2):
        offload = offload_for(model, gpus, layers)
        need = offload.weight_bytes + other_bytes + int(kv_cells * cell * offload.kv_share)
        if need > offload.room:
            break
        best = layers
    return best


__all__ = [
    "ALL_LAYERS",
    "GPU_RESERVE_BYTES",
    "GPU_SAFETY_SHARE",
    "Gpu",
    "Offload",
    "auto_layers",
    "gpu_weight_bytes",
    "offload_for",
    "offloadable",
]
