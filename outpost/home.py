"""Where Outpost keeps files it makes for itself: $OUTPOST_HOME, default ~/.cache/outpost.

A leaf module (no outpost imports), so the engine's CPU probe and the model store both use it
without one package importing the other.
"""

from __future__ import annotations

import os
from pathlib import Path


def outpost_home() -> Path:
    """$OUTPOST_HOME if set (and non-empty), else ~/.cache/outpost. Not created here."""
    env = os.environ.get("OUTPOST_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "outpost"
