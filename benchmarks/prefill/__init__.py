"""The prefill-budget benchmarks: through the engine (budget, run as
`python benchmarks/prefill_budget.py`) and by replaying batches on the runner (replay, run as
`python benchmarks/prefill_replay.py`)."""
