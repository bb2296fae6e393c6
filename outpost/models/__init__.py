"""Synthetic random-weight GGUF models in real architectures' shapes, for tests, demos and benchmarks.

`write_synthetic_model(shape, path, quant, seed)` writes one; `SHAPES` lists the shapes;
`ensure_demo_model()` provides the small model `outpost run` falls back to without -m.
"""

from outpost.models.home import demo_model_path, ensure_demo_model, outpost_home
from outpost.models.shapes import SHAPES, ModelShape
from outpost.models.synth import QUANTS, write_synthetic_model

__all__ = [
    "QUANTS",
    "SHAPES",
    "ModelShape",
    "demo_model_path",
    "ensure_demo_model",
    "outpost_home",
    "write_synthetic_model",
]
