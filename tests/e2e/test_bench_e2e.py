"""`outpost bench` (the CLI, a subprocess) against a real `outpost serve` on the tiny model, with
--compare aimed at the same server under another host name: every output file, exact prompt
lengths through /tokenize, output lengths as asked (ignore_eos), and the summary line."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

from server_harness import OUTPOST, start

IN_TOKENS, OUT_TOKENS = 24, 12


def test_bench_against_outpost_serve(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "results"
    with start(tiny_model, "-np", "2", "-c", "2048") as server:
        other = server.url.replace("127.0.0.1", "localhost")
        cmd = [
            *OUTPOST, "bench", "--url", server.url, "--compare", other, "--concurrency", "1,2",
            "--requests", "4", "--warmup", "1", "--scenario", "custom", "--input-tokens", str(IN_TOKENS),
            "--output-tokens", str(OUT_TOKENS), "--out", str(out), "--seed", "5",
        ]  # fmt: skip
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    runs = summary["runs"]
    assert [(e["url"], e["concurrency"]) for e in runs] == [
        (server.url, 1), (other, 1), (server.url, 2), (other, 2),
    ]  # fmt: skip
    for entry in runs:
        assert entry["requests_ok"] == 4 and entry["errors"] == 0, entry
        assert 0 < entry["ttft_s"]["p50"] <= entry["e2e_s"]["p50"] and entry["output_tok_s"] > 0
        assert 0 < entry["itl_s"]["p50"] <= entry["tpot_s"]["p99"] * OUT_TOKENS

    results = json.loads((out / "results.json").read_text())
    assert results["prompts"]["exact"] is True  # Outpost has /tokenize
    accepted = results["servers"][0]["accepted"]
    assert accepted["ignore_eos"] and accepted["include_usage"]
    assert results["servers"][0]["model"] == "tiny-f16"  # the first id of /v1/models

    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == 16 and all(row["error"] == "" for row in rows)
    assert {int(row["input_tokens"]) for row in rows} == {IN_TOKENS}
    assert {int(row["output_tokens"]) for row in rows} == {OUT_TOKENS}  # usage, EOS ignored
    # the server's prompt count is ours plus the chat template's fixed overhead
    assert len({int(row["prompt_tokens"]) - IN_TOKENS for row in rows}) == 1

    for name in ("throughput.png", "ttft.png", "latency.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert "ratio" in r.stderr and "out tok/s" in r.stderr
