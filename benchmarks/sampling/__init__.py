"""The host sampling benchmark (`python -m benchmarks.sampling`): logits rows from the real SmolLM2-135M
(capture), the sampler paths timed on them step by step (main)."""
