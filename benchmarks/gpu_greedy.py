"""Entry point of the GPU greedy comparison (benchmarks/gpu/greedy.py):
`python benchmarks/gpu_greedy.py --help`."""

import outpost.engine.lib  # noqa: F401  (llama.cpp before numpy.linalg: outpost/preload.py)

# isort: split
from gpu.greedy import main

if __name__ == "__main__":
    main()
