"""The GPU run (issue 29; scripts/gpu-bench.sh runs it on a lent GPU machine): greedy token ids of
Outpost's engine against llama-server at the same -ngl (greedy, run as `python
benchmarks/gpu/greedy.py`) and the docs table made from the run's raw files (report, run as
`python -m benchmarks.gpu report DIR`); the serving levels are the serve benchmark's (`--ngl`)."""
