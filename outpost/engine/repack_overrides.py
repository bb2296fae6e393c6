"""llama.cpp's repacked CPU weight layout without AMX, named tensor by tensor.

llama.cpp offers its extra CPU weight layouts as one ordered list (AMX first, then CPU_REPACK), all
or nothing. Where AMX tiles fault (cpu_probe.py) that left the plain layout for batching, while the
repacked q4_0/q4_K kernels batch and prefill much faster (1.7B q4_0, 2 threads, raw llama_decode:
8 sequences 27.7 -> 32.9 tok/s, prefill 42 -> 58 tok/s). The model loader's tensor buffer-type
overrides reach CPU_REPACK directly, but skip llama.cpp's own check that the layout can take a
tensor, so only tensors the repack takes are named: 2-D matmul weights of the transformer blocks,
of type q4_0 or q4_K, with a multiple of 8 rows (ggml's AVX2 rule in repack.cpp's
`ggml_repack_get_optimal_repack_type`). Everything else stays plain.
"""

from __future__ import annotations

import ctypes
import re
from collections import defaultdict
from typing import Any

from gguf import GGMLQuantizationType, GGUFReader

__all__ = ["RepackOverrides", "repackable_tensor_patterns"]

_REPACKABLE_TYPES = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_K})
_MATMUL_WEIGHT = re.compile(
    r"blk\.(\d+)\.(attn_q|attn_k|attn_v|attn_qkv|attn_output|ffn_gate|ffn_up|ffn_down)\.weight"
)
_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU


class _Override(ctypes.Structure):
    """struct llama_model_tensor_buft_override (the bindings only declare its pointer)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def repackable_tensor_patterns(model_path: str) -> list[str]:
    """One anchored regex per weight kind, naming the layers whose tensor the repack takes."""
    layers: dict[str, list[int]] = defaultdict(list)
    for tensor in GGUFReader(model_path).tensors:
        match = _MATMUL_WEIGHT.fullmatch(tensor.name)
        shape = [int(n) for n in tensor.shape]
        if match is None or len(shape) != 2 or tensor.tensor_type not in _REPACKABLE_TYPES:
            continue
        if shape[1] % 8 == 0:  # ggml's ne[1]: output rows
            layers[match.group(2)].append(int(match.group(1)))
    return [
        rf"^blk\.({'|'.join(str(n) for n in sorted(numbers))})\.{kind}\.weight$"
        for kind, numbers in sorted(layers.items())
    ]


def _cpu_repack_buffer_type() -> int:
    """CPU_REPACK's buffer type, from the CPU backend's list of extra buffer types."""
    from outpost.engine.lib import llama

    # Through libllama's handle, which reaches the libggml it links: `llama_cpp._ggml` would open the
    # wheel's own copy, another library where LLAMA_CPP_LIB_PATH chose a build (cpu_builds.py).
    libggml = llama.llama_cpp._lib

    libggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    libggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    libggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    libggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    libggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    libggml.ggml_backend_buft_name.restype = ctypes.c_char_p
    libggml.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    device = libggml.ggml_backend_dev_by_type(_CPU_DEVICE)
    reg = libggml.ggml_backend_dev_backend_reg(device) if device else None
    name = b"ggml_backend_dev_get_extra_bufts"
    address = libggml.ggml_backend_reg_get_proc_address(reg, name) if reg else None
    if not address:
        raise RuntimeError("llama.cpp's CPU backend lists no extra buffer types")
    extra_bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    for i in range(16):  # a NULL-terminated list of a few entries
        buft = extra_bufts[i]
        if not buft:
            break
        if libggml.ggml_backend_buft_name(buft) == b"CPU_REPACK":
            return int(buft)
    raise RuntimeError("llama.cpp's CPU backend has no CPU_REPACK buffer type")


class RepackOverrides:
    """The NULL-terminated override array for llama_model_params; keep it alive while loading."""

    def __init__(self, model_path: str) -> None:
        self.patterns = repackable_tensor_patterns(model_path)
        buft = _cpu_repack_buffer_type() if self.patterns else 0
        self._encoded = [p.encode() for p in self.patterns]  # the C strings the array points into
        entries = [_Override(p, buft) for p in self._encoded] + [_Override(None, None)]
        self._array = (_Override * len(entries))(*entries)

    def apply(self, params: Any) -> None:
        """Point `params.tensor_buft_overrides` here (with use_extra_bufts off, as the layout has it)."""
        if self.patterns:
            params.tensor_buft_overrides = ctypes.cast(self._array, ctypes.c_void_p)
