"""benchmarks/spec/'s parts: the tasks (real text), the server arms, one measured pass, the report."""
