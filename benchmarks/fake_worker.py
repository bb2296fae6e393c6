"""Entry point of the model-less cluster worker (benchmarks/cluster/fake_worker.py), which
benchmarks/cluster.py's scenario (f) starts by this path."""

from cluster.fake_worker import main

if __name__ == "__main__":
    main()
