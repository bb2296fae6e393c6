"""Sizing an engine from the machine: `-np auto`, `-c auto`, `-t auto`, `-ngl auto` (no llama.cpp here).

`machine` reads what this process may use (memory and cores, container limits included),
`footprint` what the model costs (weights, KV bytes per cell) from its GGUF header, `offload`
which layers go to a GPU (`-ngl`, auto included; the GPUs' free memory comes from the engine,
outpost/engine/devices.py), and `plan` decides. `size_for_model` ties them together for
`outpost serve` (and anything taking its flags).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from outpost.sizing.footprint import ModelFootprint, read_footprint
from outpost.sizing.machine import Cores, MachineFiles, Memory, read_cores, read_memory
from outpost.sizing.offload import Gpu, Offload
from outpost.sizing.plan import Asked, NotEnoughMemory, Plan, plan

AUTO = "auto"


def int_or_auto(text: str) -> int | str:
    """argparse type for -np/-c/-t/-ngl: a whole number or `auto`."""
    if text.strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or 'auto', got {text!r}") from None


def size_for_model(
    model_path: str, asked: Asked, files: MachineFiles | None = None, gpus: tuple[Gpu, ...] = ()
) -> Plan:
    """The plan for serving `model_path` here (`gpus`: those llama.cpp can offload to);
    NotEnoughMemory (a ValueError) if it cannot fit."""
    files = files or MachineFiles()
    return plan(read_footprint(Path(model_path)), read_memory(files), read_cores(files), asked, gpus)


__all__ = [
    "AUTO",
    "Asked",
    "Cores",
    "Gpu",
    "MachineFiles",
    "Memory",
    "ModelFootprint",
    "NotEnoughMemory",
    "Offload",
    "Plan",
    "int_or_auto",
    "plan",
    "read_cores",
    "read_footprint",
    "read_memory",
    "size_for_model",
]
