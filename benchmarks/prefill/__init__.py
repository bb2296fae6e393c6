"""The prefill-budget benchmarks: through the engine (budget, run as
`python -m benchmarks.prefill budget`) and by replaying batches on the runner (replay, run as
`python -m benchmarks.prefill replay`)."""
