"""The worker's side of the cluster: `Worker` (service), the process around it (main: `serve_worker`),
its consumers (intake), its requests on the backend (requests), coalesced replies (outbox), cancels
(cancels) and resuming a request another worker had started (resume)."""
