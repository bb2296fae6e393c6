"""`python -m benchmarks.cluster --help`: see main.py."""

from benchmarks.cluster.main import main

if __name__ == "__main__":
    main()
