"""Entry point of the soak (benchmarks/soak/): `python benchmarks/soak.py --help`."""

from soak.main import main

if __name__ == "__main__":
    raise SystemExit(main())
