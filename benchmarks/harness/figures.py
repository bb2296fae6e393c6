"""The benchmarks' figures: matplotlib on its headless backend, and one way to write a figure out."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display on the machines these run on); imported
    when a figure is drawn, so commands that draw none do not load it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 120) -> None:
    """Lays the figure out, writes it to `path` and frees it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
