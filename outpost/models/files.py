"""Where Outpost writes a file before it is finished: a hidden, unique name beside the target.

Every stored file (models, manifests, conversions, quantizations) is written there and renamed
into place once complete, so an interrupted write never leaves a file that looks finished.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def temp_path_beside(path: Path, tag: str = "") -> Path:
    """Same folder (so the final os.replace is atomic), hidden, unique per process and call."""
    middle = f".{tag}" if tag else ""
    return path.with_name(f".{path.name}{middle}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
