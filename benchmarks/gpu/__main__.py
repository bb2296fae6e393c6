"""`python -m benchmarks.gpu greedy --help` (the GPU greedy comparison, greedy.py) or
`python -m benchmarks.gpu report DIR` (the GPU run's docs table, report.py)."""

import outpost.engine.lib  # noqa: F401  (llama.cpp before numpy.linalg: outpost/preload.py)

# isort: split
import sys
from pathlib import Path

from benchmarks.gpu.greedy import main as greedy
from benchmarks.gpu.report import report

if __name__ == "__main__":
    command = sys.argv.pop(1) if len(sys.argv) > 1 else ""
    if command == "greedy":
        sys.argv[0] = "python -m benchmarks.gpu greedy"
        greedy()
    elif command == "report" and len(sys.argv) == 2:
        sys.stdout.write(report(Path(sys.argv[1])))
    else:
        sys.exit("usage: python -m benchmarks.gpu {greedy [--help], report DIR}")
