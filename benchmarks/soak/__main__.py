"""`python -m benchmarks.soak --help`: see main.py."""

from benchmarks.soak.main import main

if __name__ == "__main__":
    raise SystemExit(main())
