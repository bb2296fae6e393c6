"""What every benchmark shares: stderr logging, the cached synthetic models and waiting for readiness
(common); shared with the tests too, free ports (ports) and a real RabbitMQ (broker); the servers
benchmarks/serve/ compares (servers) and the processes of a cluster run: broker, gateway, workers,
serve (procs); the figures' matplotlib setup (figures). The load itself is `outpost bench`'s
(outpost/bench); each benchmark's folder holds its scenarios and its report."""
