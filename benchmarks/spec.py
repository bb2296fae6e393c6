"""Entry point of the speculative decoding benchmark (benchmarks/spec/): `python benchmarks/spec.py -h`."""

from spec.main import main

if __name__ == "__main__":
    raise SystemExit(main())
