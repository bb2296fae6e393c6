"""`python -m benchmarks.serve --help`: see main.py."""

import outpost.engine.lib  # noqa: F401  (llama.cpp before numpy.linalg: outpost/preload.py)

# isort: split
from benchmarks.serve.main import main

if __name__ == "__main__":
    main()
