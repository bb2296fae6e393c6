"""Property-based fuzzing of every documented route with schemathesis: no 5xx, no hang."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from server_harness import start

SCHEMATHESIS = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"


def test_schemathesis_finds_no_server_errors(tiny_model: Path, tmp_path: Path) -> None:
    # A small context and output budget keep generated requests fast; big ones are 400s.
    with start(
        tiny_model, "-np", "4", "-c", "1024", "--default-max-tokens", "8", "--max-queue", "256"
    ) as server:
        cmd = [
            SCHEMATHESIS,
            "run",
            f"{server.url}/openapi.json",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            "8",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-time",
            "30",
            "--request-timeout",
            "30",
            "--seed",
            "1",
            "--no-shrink",
            # The synthetic model has no fill-in-the-middle tokens: /infill is llama-server's 501
            # there by design (tests/e2e/test_server_native.py checks it).
            "--exclude-path",
            "/infill",
            # POST /props is llama-server's 501 without --props, which Outpost has not; schemathesis
            # tries methods the schema lacks on a path it has (GET /props) and counts a 5xx. GET
            # /props is tested in tests/unit/test_api_native.py.
            "--exclude-path",
            "/props",
            # One worker: with two, hypothesis parses lambdas' source in two threads at once, and
            # CPython 3.11's ast.parse is not thread-safe ("AST constructor recursion depth
            # mismatch" crashed the run, not the server, in a one-core run of the suite).
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
            "--report-dir",
            str(tmp_path),
        ]
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=150, cwd=tmp_path
        )  # its caches stay out of the repo
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        assert server.proc.poll() is None, "the server survived the fuzzing"
        assert server.health()["status"] == "ok"
