"""Entry point of the serve benchmark (benchmarks/serve/): `python benchmarks/serve.py --help`."""

import outpost.engine.lib  # noqa: F401  (llama.cpp before numpy.linalg: outpost/preload.py)

# isort: split
from serve.main import main

if __name__ == "__main__":
    main()
