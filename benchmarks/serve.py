"""Entry point of the serve benchmark (benchmarks/serve/): `python benchmarks/serve.py --help`."""

from serve.main import main

if __name__ == "__main__":
    main()
