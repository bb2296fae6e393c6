"""The server commands' composition roots: `serve`, `worker` and `gateway` built from settings blocks.

Each root takes the blocks its command uses (outpost/settings) and wires the packages together:
serve = the API over a local engine, worker = the cluster's consumer over a local engine, gateway =
the API over the broker. Nothing else builds engines and servers, so `outpost.api` imports neither
`outpost.engine` nor `outpost.serving.local_backend`.
"""
