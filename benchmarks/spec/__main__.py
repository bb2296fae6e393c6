"""`python -m benchmarks.spec --help`: see main.py."""

from benchmarks.spec.main import main

if __name__ == "__main__":
    raise SystemExit(main())
