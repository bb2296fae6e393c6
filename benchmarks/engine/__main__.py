"""`python -m benchmarks.engine --help`: see main.py."""

from benchmarks.engine.main import main

if __name__ == "__main__":
    main()
