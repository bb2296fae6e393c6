"""`python -m benchmarks.serve --scenarios models` at a tiny size: two tiny models, one round, both
setups (one Outpost over a --models-dir, and one "llama-server" per model, played by `outpost serve`
behind a shim that drops the flag it lacks, so no llama.cpp build is needed). Asserts the structure
of what it writes (tables, results.json, the plot), never a speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from outpost.models import write_synthetic_model

SHIM = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
if "-tb" in args:  # llama-server's batch threads: outpost serve has one -t
    i = args.index("-tb")
    del args[i : i + 2]
os.execv(sys.executable, [sys.executable, "-m", "outpost.cli", "serve", *args])
"""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("pair")
    return [write_synthetic_model("tiny", folder / f"tiny-{s}.gguf", quant="f16", seed=s) for s in (0, 1)]


def test_models_scenario_tiny(pair: list[Path], tmp_path: Path) -> None:
    shim = tmp_path / "llama-server"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "benchmarks.serve", "--scenarios", "models",
        "--servers", "outpost,llama_server",
        "--pair", ",".join(map(str, pair)), "--models-levels", "2", "--rounds", "1", "--requests", "2",
        "--warmup", "2", "--max-tokens", "4", "--input-tokens", "8", "--parallel", "2", "--threads", "1",
        "--seed", "3", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "LLAMA_SERVER": str(shim), "OUTPOST_KERNEL_PROBE": "off"}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Cold vs warm TTFT" in r.stderr and "Two models at once" in r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])["models"]
    assert {row["model"] for row in summary["cold_warm"]} == {"tiny-0", "tiny-1"}
    assert all(row["cold_ttft_s"] and row["warm_ttft_s"] and row["load_s"] for row in summary["cold_warm"])
    assert [(row["server"], row["streams"], row["errors"]) for row in summary["two_models"]] == [
        ("outpost", 2, 0),
        ("llama-server x2", 2, 0),
    ]
    assert [ratio["streams"] for ratio in summary["two_models_ratios"]] == [2]
    doc = json.loads((out / "results.json").read_text())["models"]
    runs = doc["two_models"]["runs"]
    assert [sorted(run["per_model"]) for run in runs] == [["tiny-0", "tiny-1"]] * 2
    assert all(run["combined"]["requests_ok"] == 2 for run in runs)
    assert len(doc["servers"]["llama-server x2"]) == 2
    assert (out / "models.png").stat().st_size > 10_000
