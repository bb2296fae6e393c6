"""The compute devices llama.cpp sees, with their free memory: what `-ngl auto` and sizing read.

ggml's device registry (ggml-backend.h: `ggml_backend_dev_count`, `_get`, `_name`, `_description`,
`_type`, `_memory`) is not in llama-cpp-python's bindings, so it is declared here with ctypes on
the libllama the bindings loaded (`llama_cpp.llama_cpp._lib`): a lookup through its handle reaches
the libggml *it* links, also when LLAMA_CPP_LIB_PATH points at another build (the bindings' own
`llama_cpp._ggml` always opens the wheel's copy). A CPU build lists the CPU device (and maybe an
accelerator such as BLAS) and no GPU; a CUDA build adds one GPU device per card. Asking a CUDA
device for its memory makes its CUDA context, which the model load would make anyway.

llama.cpp offloads to GPU devices, or to integrated ones (IGPU) where there is no discrete GPU
(src/llama.cpp, `llama_model_load_from_file_impl`); `gpu_devices` applies the same rule.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, Literal

from outpost.sizing.offload import Gpu

DeviceKind = Literal["cpu", "gpu", "igpu", "accel", "meta"]
# enum ggml_backend_dev_type, in order (ggml/include/ggml-backend.h of the pinned llama.cpp)
_KINDS: tuple[DeviceKind, ...] = ("cpu", "gpu", "igpu", "accel", "meta")


@dataclass(frozen=True)
class Device:
    """One entry of ggml's device list."""

    name: str
    description: str
    kind: DeviceKind
    free: int
    total: int


class _Registry:
    """ggml's device functions, declared on a loaded library (a CDLL, or a stand-in in tests)."""

    def __init__(self, lib: Any) -> None:
        self.lib = lib
        for name, restype, argtypes in (
            ("ggml_backend_dev_count", ctypes.c_size_t, []),
            ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
            ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
            ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
            (
                "ggml_backend_dev_memory",
                None,
                [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
            ),
        ):
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes

    def devices(self) -> list[Device]:
        found = []
        for index in range(int(self.lib.ggml_backend_dev_count())):
            dev = self.lib.ggml_backend_dev_get(index)
            free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
            self.lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
            kind = int(self.lib.ggml_backend_dev_type(dev))
            found.append(
                Device(
                    name=(self.lib.ggml_backend_dev_name(dev) or b"?").decode(errors="replace"),
                    description=(self.lib.ggml_backend_dev_description(dev) or b"").decode(errors="replace"),
                    kind=_KINDS[kind] if 0 <= kind < len(_KINDS) else "accel",
                    free=int(free.value),
                    total=int(total.value),
                )
            )
        return found


def list_devices(lib: Any = None) -> list[Device]:
    """Every device of the llama.cpp build Outpost loaded (`lib`: another library, for tests)."""
    if lib is None:
        from outpost.engine.lib import ensure_backend, llama  # lib.py chooses the build first

        ensure_backend()
        lib = llama.llama_cpp._lib
    return _Registry(lib).devices()


def offload_targets(devices: list[Device]) -> tuple[Gpu, ...]:
    """The devices llama.cpp would put layers on: the GPUs, else the integrated GPUs."""
    for kind in ("gpu", "igpu"):
        picked = tuple(Gpu(d.name, d.description, d.free, d.total) for d in devices if d.kind == kind)
        if picked:
            return picked
    return ()


def gpu_devices() -> tuple[Gpu, ...]:
    """The GPUs layers may go to, with their free memory now; () on a CPU-only build."""
    return offload_targets(list_devices())


__all__ = ["Device", "gpu_devices", "list_devices", "offload_targets"]
