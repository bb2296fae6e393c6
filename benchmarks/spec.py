"""Speculative decoding benchmark (issue 24): Outpost vs llama-server, without and with each
drafter, side by side in one run. The parts live in benchmarks/spec/; see spec/main.py.

    python benchmarks/spec.py [--rounds 3] [--streams 1,4,8] [--no-draft] [--out DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spec.main import main

if __name__ == "__main__":
    sys.exit(main())
