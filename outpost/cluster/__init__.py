"""Scale-out over RabbitMQ: `outpost gateway` (HTTP API -> broker) and `outpost worker` (broker -> engine).

broker/: the connection (session, connect: URLs and TLS), what lives on the broker (topology) and the
one publish-and-retry of a reply (publish); gateway/: the remote InferenceBackend a gateway serves and
everything it tracks (link, remote, inflight, fleet, routing, admission, verdicts, metrics, main);
worker/: consumes a model's queues and streams replies (service, intake, requests, outbox, cancels,
resume). Shared by both sides here: the versioned JSON messages (wire, wire_embed), heartbeats,
prompt-prefix hashes and embeddings.
"""
