"""Entry point of the speculative decoding benchmark (benchmarks/spec/): `python benchmarks/spec.py --help`."""

from spec.main import main

if __name__ == "__main__":
    raise SystemExit(main())
