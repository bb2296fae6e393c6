"""Outpost's benchmarks, each a package run as a module from the repository root:
`python -m benchmarks.<name> --help` (engine, serve, spec, cluster, soak, prefill, gpu, sampling)."""
