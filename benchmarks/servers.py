"""Entry point of llama-cpp-python's server worker, which benchmarks/serve.py starts by this path
(benchmarks/harness/servers.py): `python benchmarks/servers.py --llama-cpp-python-server ARGS`."""

import sys

from harness.servers import LCP_WORKER, run_llama_cpp_python_server

if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == LCP_WORKER:
    run_llama_cpp_python_server(sys.argv[2:])
