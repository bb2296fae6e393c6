"""The engine-side serving stack: one llama context behind the `InferenceBackend` seam.

`engine_core` is the thread that owns the context (schedule -> execute -> update) and the client
asyncio talks to it through; `assembly` puts model, executor, scheduler and core together from the
configuration; `local_backend` is that engine behind outpost/backend.py's protocol (what `outpost
serve` and a cluster worker answer with); `slot_files` saves and restores a slot's KV cache.
"""
