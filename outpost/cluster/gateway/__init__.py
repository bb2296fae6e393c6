"""The gateway's side of the cluster: `GatewayLink` (link), one `RemoteBackend` per model (remote), its
requests in flight (inflight), the live workers (fleet), queue choice (routing), the waiting bound
(admission), final answers nobody else gives (verdicts), /metrics (metrics), and the process (main)."""
