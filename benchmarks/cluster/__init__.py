"""The cluster benchmark (run as `python -m benchmarks.cluster`): scenarios (a)-(f) of a broker,
gateway and workers on loopback (basic, prefix, chaos, gateway, floor, paired), the streaming
clients they check every stream with (stream, http1), the model-less worker of (f) (fake_worker)
and the report (report, plots)."""
