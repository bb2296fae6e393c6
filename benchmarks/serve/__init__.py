"""The serve benchmark (run as `python -m benchmarks.serve`): `outpost serve` against llama-server
and llama-cpp-python's server; its workloads (scenarios), medians and ratios (report), markdown
tables (tables) and PNGs (plots)."""
