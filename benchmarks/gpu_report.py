"""Entry point of the GPU run's docs table (benchmarks/gpu/report.py):
`python benchmarks/gpu_report.py DIR`."""

import sys
from pathlib import Path

from gpu.report import report

if __name__ == "__main__":
    sys.stdout.write(report(Path(sys.argv[1])))
