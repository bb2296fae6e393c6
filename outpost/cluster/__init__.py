"""Scale-out over RabbitMQ: `outpost gateway` (HTTP API -> broker) and `outpost worker` (broker -> engine).

wire: the versioned JSON messages; topology: queue and exchange names and arguments; worker:
consumes a model's request queue and streams replies; gateway: the remote InferenceBackend.
"""
