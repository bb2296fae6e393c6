"""Where Outpost keeps generated files, and the built-in demo model that lives there.

OUTPOST_HOME (default ~/.cache/outpost) holds demo/tiny-f16.gguf, generated on first use from the
`tiny` shape with seed 0. Generation is atomic (write_synthetic_model renames a finished file into
place), so concurrent first runs at worst both generate and one rename wins with identical bytes.
"""

from __future__ import annotations

from pathlib import Path

from outpost.home import outpost_home
from outpost.models.synth import ProgressFn, write_synthetic_model

DEMO_SHAPE = "tiny"
# f16, not q8_0: 15 MB vs 8 MB hardly matters, generation needs no quantizer, batched and one-by-one
# decoding agree to ~0.05 logits (q8_0: ~1.2), and llama.cpp's AMX path, which crashes on batched
# q8_0/q4_0 matmuls on some Xeons (llama.cpp issue #20824), is never taken for f16 weights.
DEMO_QUANT = "f16"
DEMO_SEED = 0

__all__ = ["DEMO_QUANT", "DEMO_SEED", "DEMO_SHAPE", "demo_model_path", "ensure_demo_model", "outpost_home"]


def demo_model_path() -> Path:
    """Where the demo model is (or will be) stored."""
    return outpost_home() / "demo" / f"{DEMO_SHAPE}-{DEMO_QUANT}.gguf"


def ensure_demo_model(progress: ProgressFn | None = None) -> Path:
    """Return the demo model's path, generating it first if it is not there yet."""
    path = demo_model_path()
    if path.is_file():
        return path
    return write_synthetic_model(DEMO_SHAPE, path, quant=DEMO_QUANT, seed=DEMO_SEED, progress=progress)
