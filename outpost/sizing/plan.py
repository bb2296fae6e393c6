"""Deciding slots (-np), KV cells (-c) and threads (-t) from the machine and the model; pure.

Memory first. What the process must hold besides the KV cache is counted up front: the weights
(the file's size), llama.cpp's compute and logits buffers (estimated from the micro-batch, the
vocabulary and, with flash attention off, the attention scores over every cell), and a safety
margin for Python, the HTTP server and the allocator. What is left is the room for the KV cache.
llama.cpp zeroes the whole cache when it creates the context, so every cell asked for is resident
memory from the first second: an explicit -c/-np that does not fit the room is refused before
anything loads (the kernel's OOM killer would otherwise end the server mid-load or mid-request).

`auto` takes only half that room for the KV cache (the rest stays for the page cache and whatever
else shares the machine or container) and then decides:
- slots: 4 per usable core, at most 8 (on a CPU, decoding more sequences per step pays up to
  about 8: each step reads the weights once for all of them, until attention and the per-token
  matmul work dominate); fewer when memory cannot give each at least MIN_POSITIONS positions;
- positions per slot: the trained context, at most POSITION_CAP, at most what the memory allows;
  `-c` = slots * positions, so a stream per slot gets exactly that many cells and one shared pool
  holds every slot at its longest;
- threads: the usable cores (affinity mask, CFS quota): more threads than cores only contend.

With layers on a GPU (`-ngl`, sizing/offload.py) the offloaded layers' weights, their share of
every KV cell and the compute buffers live in GPU memory, the rest in host memory, and each of the
two must fit: `-c auto` takes the most positions both allow (AUTO_KV_SHARE of the host's room, and
GPU_KV_SHARE of the GPU's: nothing else uses a GPU's memory the way the page cache uses the host's).
With every layer offloaded the CPU no longer bounds how many sequences a step can carry, so `-np
auto` starts from GPU_AUTO_SLOTS instead of the per-core rule. A build without a GPU offloads
nothing and is sized as a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from outpost.sizing.footprint import ModelFootprint
from outpost.sizing.machine import Cores, Memory
from outpost.sizing.offload import Gpu, Offload, auto_layers, offload_for

GiB = 1024**3
MiB = 1024**2
CELL_ALIGN = 256  # llama.cpp pads n_ctx (and each stream's share of it) to 256 cells
POSITION_CAP = 8192  # positions per slot auto picks at most (the old default context)
MIN_POSITIONS = 2048  # auto drops slots before giving one fewer positions than this
MAX_AUTO_SLOTS = 8
SLOTS_PER_CORE = 4
AUTO_KV_SHARE = 0.5  # the part of the free room `auto` gives the KV cache
PROCESS_OVERHEAD = 512 * MiB  # Python, uvicorn, numpy, llama.cpp's own state
SAFETY_SHARE = 0.05  # and 5% of the memory available, for allocator slack and growth
GPU_KV_SHARE = 0.9  # the part of the GPU's room left by weights and buffers `auto` gives the KV cache
# Slots -np auto starts from with every layer on a GPU; not measured yet (the device benchmark,
# benchmarks/gpu/, runs at 1, 32 and 64 streams with explicit -np).
GPU_AUTO_SLOTS = 16


@dataclass(frozen=True)
class Asked:
    """What the user asked for; None = auto. `ctx_size` 0 = the trained context, at most 8192."""

    parallel: int | None = None
    ctx_size: int | None = None
    threads: int | None = None
    n_ubatch: int = 512
    n_batch: int = 512
    flash_attn: str = "auto"  # as llama.cpp gets it (engine/config.py resolve_flash_attn)
    kv_type: str = "f16"
    kv_unified: str = "auto"  # "on": one pool every token attends over; else a stream per slot
    check_memory: bool = True  # refuse an explicit -c/-np the host memory cannot hold
    gpu_layers: int | None = 0  # -ngl: layers offloaded (-1: all); None: auto, as many as fit


@dataclass(frozen=True)
class Plan:
    """The sizing decision and what it was made from."""

    slots: int
    n_ctx: int  # KV cells for all slots, as llama.cpp will round them
    threads: int
    kv_bytes: int
    reserved_bytes: int  # weights + buffers + margin: what the process needs besides the KV cache
    memory: Memory
    cores: Cores
    model_bytes: int
    auto: tuple[str, ...]  # which of "slots", "ctx", "threads", "gpu layers" were decided here
    offload: Offload | None = None  # the layers on GPUs; None: sized without asking for a GPU
    gpu_asked: bool = False  # -ngl asked for layers (or auto) on a GPU

    @property
    def n_gpu_layers(self) -> int:
        """What the engine gets for -ngl (-1: every layer)."""
        return self.offload.n_gpu_layers if self.offload is not None else 0

    @property
    def positions(self) -> int:
        return self.n_ctx // self.slots

    def why(self) -> str:
        """Where the numbers came from, for the ready line."""
        picked = ", ".join(self.auto) if self.auto else "nothing"
        cores = plural(self.cores.count, "usable core")
        return (
            f"{human_bytes(self.memory.available)} available ({self.memory.source}), model "
            f"{human_bytes(self.model_bytes)}, {cores} ({self.cores.source}){self._gpu_why()}; "
            f"auto: {picked}"
        )

    def _gpu_why(self) -> str:
        offload = self.offload
        if not self.gpu_asked or offload is None:
            return ""
        if not offload.gpus:
            return ", no GPU in this llama.cpp build: every layer on the CPU"
        kv_gpu = int(self.kv_bytes * offload.kv_share)
        return (
            f", GPU: {offload.describe()} ({human_bytes(offload.free)} free; "
            f"{human_bytes(offload.weight_bytes)} weights and {human_bytes(kv_gpu)} KV there)"
        )


class NotEnoughMemory(ValueError):
    """The asked-for KV cache and the model do not fit the memory this process may use."""


def plural(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def human_bytes(n: float) -> str:
    """1.4 GiB, or 96 MiB below one GiB."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.0f} MiB"


def _pad(n: int) -> int:
    return -(-n // CELL_ALIGN) * CELL_ALIGN


def compute_bytes(model: ModelFootprint, asked: Asked, n_ctx: int, slots: int) -> int:
    """llama.cpp's compute + logits buffers, roughly and on the high side: activations per
    micro-batch token (hidden states and FFN, ~24 floats per embedding unit), a logits row per
    batch token (output buffer) and per micro-batch token (graph), and with flash attention off
    the attention scores and their softmax over every cell a token attends over (the whole pool,
    or its own slot's stream)."""
    ubatch = min(asked.n_ubatch, asked.n_batch)
    total = 4 * ubatch * (model.n_vocab + 24 * model.n_embd) + 4 * asked.n_batch * model.n_vocab
    if asked.flash_attn == "off":
        attended = n_ctx if asked.kv_unified == "on" or slots <= 1 else -(-n_ctx // slots)
        total += 2 * 4 * model.n_head * ubatch * attended
    return total


def reserved_bytes(
    model: ModelFootprint,
    asked: Asked,
    memory: Memory,
    n_ctx: int,
    slots: int,
    offload: Offload | None = None,
) -> int:
    """Host bytes besides the KV cache: the weights not offloaded, buffers and the margin."""
    margin = PROCESS_OVERHEAD + int(SAFETY_SHARE * memory.available)
    on_gpu = offload.weight_bytes if offload is not None else 0
    return model.file_bytes - on_gpu + compute_bytes(model, asked, n_ctx, slots) + margin


def gpu_reserved_bytes(model: ModelFootprint, asked: Asked, offload: Offload, n_ctx: int, slots: int) -> int:
    """GPU bytes besides the KV cache: the offloaded weights and the compute buffers."""
    if not offload.layers:
        return 0
    return offload.weight_bytes + compute_bytes(model, asked, n_ctx, slots)


def _kv_rooms(
    model: ModelFootprint, asked: Asked, memory: Memory, offload: Offload, n_ctx: int, slots: int
) -> list[tuple[float, float]]:
    """(room `auto` gives the KV cache, KV bytes per cell there) for each memory the cache uses."""
    cell = model.kv_bytes_per_cell(asked.kv_type)
    host_room = memory.available - reserved_bytes(model, asked, memory, n_ctx, slots, offload)
    rooms = [(AUTO_KV_SHARE * host_room, cell * (1 - offload.kv_share))]
    if offload.layers:
        gpu_room = offload.room - gpu_reserved_bytes(model, asked, offload, n_ctx, slots)
        rooms.append((GPU_KV_SHARE * gpu_room, cell * offload.kv_share))
    return [(room, per_cell) for room, per_cell in rooms if per_cell > 0]


def kv_bytes(model: ModelFootprint, asked: Asked, n_ctx: int, slots: int) -> int:
    """Cache bytes for n_ctx cells, padded as llama.cpp pads them (per stream when split)."""
    cells = max(_pad(n_ctx), _pad(-(-n_ctx // slots)) * slots)
    return cells * model.kv_bytes_per_cell(asked.kv_type)


def _auto_slots(cores: Cores, asked: Asked, offload: Offload) -> int:
    per_device = GPU_AUTO_SLOTS if offload.all_layers else min(MAX_AUTO_SLOTS, SLOTS_PER_CORE * cores.count)
    return max(1, min(per_device, asked.n_batch))


def _fitting_positions(
    model: ModelFootprint, asked: Asked, memory: Memory, offload: Offload, slots: int, limit: int
) -> int:
    """The most positions per slot (a multiple of 256, <= limit) whose cache takes at most its
    share of the room left beside it, in host and GPU memory alike; 0 when not even 256 fit."""
    positions = limit - limit % CELL_ALIGN
    while positions >= CELL_ALIGN:
        n_ctx = slots * positions
        rooms = _kv_rooms(model, asked, memory, offload, n_ctx, slots)
        if all(n_ctx * per_cell <= room for room, per_cell in rooms):
            return positions
        # Shrink towards what fits (the compute estimate shrinks too), at least one step of 256.
        fit = min(int(max(0.0, room) / (per_cell * slots)) for room, per_cell in rooms)
        positions = min(positions - CELL_ALIGN, fit - fit % CELL_ALIGN)
    return 0


def _auto_context(
    model: ModelFootprint, asked: Asked, memory: Memory, offload: Offload, slots: int, fixed: bool
) -> tuple[int, int]:
    """(slots, positions per slot) for -c auto; with -np auto, fewer slots before short ones."""
    limit = min(model.n_ctx_train or POSITION_CAP, POSITION_CAP)
    positions = _fitting_positions(model, asked, memory, offload, slots, limit)
    while not fixed and slots > 1 and positions < min(MIN_POSITIONS, limit):
        slots -= 1
        positions = _fitting_positions(model, asked, memory, offload, slots, limit)
    if positions == 0:
        n_ctx = slots * CELL_ALIGN
        need = reserved_bytes(model, asked, memory, n_ctx, slots, offload) + 2 * kv_bytes(
            model, asked, n_ctx, slots
        )
        raise NotEnoughMemory(
            f"not enough memory for {plural(slots, 'slot')} of {CELL_ALIGN} positions: the model, its "
            f"buffers and that KV cache need about {human_bytes(need)} with headroom, "
            f"{human_bytes(memory.available)} is available ({memory.source})"
        )
    return slots, positions


def _check_fits(
    model: ModelFootprint, asked: Asked, memory: Memory, offload: Offload, slots: int, n_ctx: int
) -> None:
    all_kv = kv_bytes(model, asked, n_ctx, slots)
    need_kv = int(all_kv * (1 - offload.kv_share))
    need = need_kv + reserved_bytes(model, asked, memory, n_ctx, slots, offload)
    cell = model.kv_bytes_per_cell(asked.kv_type)
    if asked.check_memory and need > memory.available:
        raise NotEnoughMemory(
            f"-c {n_ctx} with -np {slots} needs about {human_bytes(need)} ({human_bytes(need_kv)} KV "
            f"cache at {cell} bytes per cell, model {human_bytes(model.file_bytes - offload.weight_bytes)}, "
            f"buffers and margin) but {human_bytes(memory.available)} is available ({memory.source}): "
            "lower -c or -np, or leave them to auto"
        )
    gpu_kv = all_kv - need_kv
    gpu_need = gpu_kv + gpu_reserved_bytes(model, asked, offload, n_ctx, slots)
    if offload.layers and gpu_need > offload.room:
        raise NotEnoughMemory(
            f"-c {n_ctx} with -np {slots} and {offload.describe()} needs about {human_bytes(gpu_need)} "
            f"of GPU memory ({human_bytes(gpu_kv)} KV cache, {human_bytes(offload.weight_bytes)} "
            f"weights, buffers) but {human_bytes(offload.room)} is usable of {human_bytes(offload.free)} "
            "free: lower -c, -np or -ngl, or leave them to auto"
        )


def _offload(model: ModelFootprint, asked: Asked, gpus: tuple[Gpu, ...]) -> Offload:
    """The layers -ngl puts on the GPUs; for auto, the most whose weights and buffers fit beside a
    KV cache of the asked context (or MIN_POSITIONS per slot)."""
    if asked.gpu_layers is not None or not gpus:
        return offload_for(model, gpus, asked.gpu_layers or 0)
    slots = asked.parallel or GPU_AUTO_SLOTS
    positions = min(model.n_ctx_train or POSITION_CAP, MIN_POSITIONS)
    cells = asked.ctx_size or slots * positions
    other = compute_bytes(model, asked, cells, slots)
    layers = auto_layers(model, gpus, other, cells, model.kv_bytes_per_cell(asked.kv_type))
    return offload_for(model, gpus, layers)


def plan(
    model: ModelFootprint, memory: Memory, cores: Cores, asked: Asked, gpus: tuple[Gpu, ...] = ()
) -> Plan:
    """Slots, KV cells, threads and GPU layers for this model on this machine (`gpus`: llama.cpp's
    GPU devices, engine/devices.py); NotEnoughMemory if it cannot fit (an explicit request larger
    than the machine, or a model too large for it)."""
    named = (("slots", asked.parallel), ("ctx", asked.ctx_size), ("threads", asked.threads))
    auto = tuple(name for name, value in named if value is None)
    if asked.gpu_layers is None:
        auto += ("gpu layers",)
    offload = _offload(model, asked, gpus)
    slots = asked.parallel if asked.parallel is not None else _auto_slots(cores, asked, offload)
    if asked.ctx_size is None:
        fixed = asked.parallel is not None
        slots, positions = _auto_context(model, asked, memory, offload, slots, fixed)
        n_ctx = slots * positions
    else:
        n_ctx = asked.ctx_size or min(model.n_ctx_train or POSITION_CAP, POSITION_CAP)
        if asked.parallel is None:  # a stream per slot needs at least 256 cells each
            slots = max(1, min(slots, n_ctx // CELL_ALIGN))
    _check_fits(model, asked, memory, offload, slots, n_ctx)
    return Plan(
        slots=slots,
        n_ctx=n_ctx,
        threads=asked.threads if asked.threads is not None else cores.count,
        kv_bytes=kv_bytes(model, asked, n_ctx, slots),
        reserved_bytes=reserved_bytes(model, asked, memory, n_ctx, slots, offload),
        memory=memory,
        cores=cores,
        model_bytes=model.file_bytes,
        auto=auto,
        offload=offload,
        gpu_asked=asked.gpu_layers != 0,
    )


__all__ = ["GPU_AUTO_SLOTS", "Asked", "NotEnoughMemory", "Plan", "plan"]
