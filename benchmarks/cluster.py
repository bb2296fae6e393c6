"""Entry point of the cluster benchmark (benchmarks/cluster/): `python benchmarks/cluster.py --help`."""

from cluster.main import main

if __name__ == "__main__":
    main()
