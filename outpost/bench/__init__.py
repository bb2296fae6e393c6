"""`outpost bench`: a load benchmark for any OpenAI-compatible server (it never imports the engine).

Layers, each its own module: `config` (what to run) -> `prompts`/`tokens` (exact-length prompts)
-> `loadgen` (closed and open loop) -> `client` (one streamed request, timed) -> `records`/`stats`
(per-request records, percentiles) -> `report`/`plots` (tables, results.json, requests.csv, PNGs).
The API for scripts: `outpost.bench.runner.run_bench(BenchConfig) -> BenchResult`, then
`outpost.bench.report.write_outputs`. Nothing is imported here, so `outpost --help` stays fast.
"""
