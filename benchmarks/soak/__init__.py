"""The soak (run as `python -m benchmarks.soak`): a long mixed load against one `outpost serve`,
its request kinds (kinds), the server it starts and watches (server) and its verdict (report)."""
