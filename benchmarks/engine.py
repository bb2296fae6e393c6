"""Entry point of the engine benchmark (benchmarks/engine/): `python benchmarks/engine.py --help`."""

from engine.main import main

if __name__ == "__main__":
    main()
