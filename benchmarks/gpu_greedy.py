"""Entry point of the GPU greedy comparison (benchmarks/gpu/greedy.py):
`python benchmarks/gpu_greedy.py --help`."""

from gpu.greedy import main

if __name__ == "__main__":
    main()
