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
"""

from __future__ import annotations

from dataclasses import dataclass

from outpost.sizing.footprint import ModelFootprint
from outpost.sizing.machine import Cores, Memory

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
    check_memory: bool = True  # off with GPU layers: their KV and weights live in device memory


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
    auto: tuple[str, ...]  # which of "slots", "ctx", "threads" were decided here

    @property
    def positions(self) -> int:
        return self.n_ctx // self.slots

    def why(self) -> str:
        """Where the numbers came from, for the ready line."""
        picked = ", ".join(self.auto) if self.auto else "nothing"
        cores = plural(self.cores.count, "usable core")
        return (
            f"{human_bytes(self.memory.available)} available ({self.memory.source}), model "
            f"{human_bytes(self.model_bytes)}, {cores} ({self.cores.source}); auto: {picked}"
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


def reserved_bytes(model: ModelFootprint, asked: Asked, memory: Memory, n_ctx: int, slots: int) -> int:
    margin = PROCESS_OVERHEAD + int(SAFETY_SHARE * memory.available)
    return model.file_bytes + compute_bytes(model, asked, n_ctx, slots) + margin


def kv_bytes(model: ModelFootprint, asked: Asked, n_ctx: int, slots: int) -> int:
    """Cache bytes for n_ctx cells, padded as llama.cpp pads them (per stream when split)."""
    cells = max(_pad(n_ctx), _pad(-(-n_ctx // slots)) * slots)
    return cells * model.kv_bytes_per_cell(asked.kv_type)


def _auto_slots(cores: Cores, asked: Asked) -> int:
    return max(1, min(MAX_AUTO_SLOTS, SLOTS_PER_CORE * cores.count, asked.n_batch))


def _fitting_positions(model: ModelFootprint, asked: Asked, memory: Memory, slots: int, limit: int) -> int:
    """The most positions per slot (a multiple of 256, <= limit) whose cache takes at most
    AUTO_KV_SHARE of the room left beside it; 0 when not even 256 fit."""
    cell = max(1, model.kv_bytes_per_cell(asked.kv_type))
    positions = limit - limit % CELL_ALIGN
    while positions >= CELL_ALIGN:
        n_ctx = slots * positions
        room = memory.available - reserved_bytes(model, asked, memory, n_ctx, slots)
        if n_ctx * cell <= AUTO_KV_SHARE * room:
            return positions
        # Shrink towards what fits (the compute estimate shrinks too), at least one step of 256.
        fit = int(AUTO_KV_SHARE * max(0, room) / (cell * slots))
        positions = min(positions - CELL_ALIGN, fit - fit % CELL_ALIGN)
    return 0


def _auto_context(
    model: ModelFootprint, asked: Asked, memory: Memory, slots: int, fixed: bool
) -> tuple[int, int]:
    """(slots, positions per slot) for -c auto; with -np auto, fewer slots before short ones."""
    limit = min(model.n_ctx_train or POSITION_CAP, POSITION_CAP)
    positions = _fitting_positions(model, asked, memory, slots, limit)
    while not fixed and slots > 1 and positions < min(MIN_POSITIONS, limit):
        slots -= 1
        positions = _fitting_positions(model, asked, memory, slots, limit)
    if positions == 0:
        n_ctx = slots * CELL_ALIGN
        need = reserved_bytes(model, asked, memory, n_ctx, slots) + 2 * kv_bytes(model, asked, n_ctx, slots)
        raise NotEnoughMemory(
            f"not enough memory for {plural(slots, 'slot')} of {CELL_ALIGN} positions: the model, its "
            f"buffers and that KV cache need about {human_bytes(need)} with headroom, "
            f"{human_bytes(memory.available)} is available ({memory.source})"
        )
    return slots, positions


def _check_fits(model: ModelFootprint, asked: Asked, memory: Memory, slots: int, n_ctx: int) -> None:
    need_kv = kv_bytes(model, asked, n_ctx, slots)
    need = need_kv + reserved_bytes(model, asked, memory, n_ctx, slots)
    if asked.check_memory and need > memory.available:
        cell = model.kv_bytes_per_cell(asked.kv_type)
        raise NotEnoughMemory(
            f"-c {n_ctx} with -np {slots} needs about {human_bytes(need)} ({human_bytes(need_kv)} KV "
            f"cache at {cell} bytes per cell, model {human_bytes(model.file_bytes)}, buffers and "
            f"margin) but {human_bytes(memory.available)} is available ({memory.source}): "
            "lower -c or -np, or leave them to auto"
        )


def plan(model: ModelFootprint, memory: Memory, cores: Cores, asked: Asked) -> Plan:
    """Slots, KV cells and threads for this model on this machine; NotEnoughMemory if it cannot
    fit (an explicit request larger than the machine, or a model too large for it)."""
    auto = tuple(
        name
        for name, value in (("slots", asked.parallel), ("ctx", asked.ctx_size), ("threads", asked.threads))
        if value is None
    )
    slots = asked.parallel if asked.parallel is not None else _auto_slots(cores, asked)
    if asked.ctx_size is None:
        slots, positions = _auto_context(model, asked, memory, slots, fixed=asked.parallel is not None)
        n_ctx = slots * positions
    else:
        n_ctx = asked.ctx_size or min(model.n_ctx_train or POSITION_CAP, POSITION_CAP)
        if asked.parallel is None:  # a stream per slot needs at least 256 cells each
            slots = max(1, min(slots, n_ctx // CELL_ALIGN))
    _check_fits(model, asked, memory, slots, n_ctx)
    return Plan(
        slots=slots,
        n_ctx=n_ctx,
        threads=asked.threads if asked.threads is not None else cores.count,
        kv_bytes=kv_bytes(model, asked, n_ctx, slots),
        reserved_bytes=reserved_bytes(model, asked, memory, n_ctx, slots),
        memory=memory,
        cores=cores,
        model_bytes=model.file_bytes,
        auto=auto,
    )


__all__ = ["Asked", "NotEnoughMemory", "Plan", "plan"]
