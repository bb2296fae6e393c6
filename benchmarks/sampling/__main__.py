"""`python -m benchmarks.sampling`: see main.py."""

from benchmarks.sampling.main import main

if __name__ == "__main__":
    raise SystemExit(main())
