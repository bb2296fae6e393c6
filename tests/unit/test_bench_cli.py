"""`outpost bench` through the real CLI entry point against fake servers: the summary line's shape,
the files it writes, --fail-on (exit 3), bad usage (exit 2), an unreachable server (exit 1), and
plots with labelled axes and a legend naming every compared server."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from bench_fake_server import FakeConfig, FakeServer, bench
from matplotlib.axes import Axes

from outpost.bench.failon import METRICS, parse_fail_on
from outpost.bench.plots import latency_figure, throughput_figure, ttft_figure
from outpost.cli import main

FAST = FakeConfig(ttft=0.01, itl=0.002)
STATS = {"mean", "p50", "p90", "p95", "p99"}
ENTRY = {
    "url", "concurrency", "requests_ok", "errors", "errors_by_code", "output_tok_s", "requests_per_s",
    "ttft_s", "itl_s", "tpot_s", "e2e_s",
}  # fmt: skip


def run_cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, str, str]:
    base = ["bench", "--url", url, "--scenario", "custom", "--input-tokens", "10", "--output-tokens", "4"]
    rc = main([*base, "--seed", "3", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_summary_line_results_json_and_requests_csv(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_dir = tmp_path / "r"
    with FakeServer(FAST) as fake:
        args = [
            "--concurrency",
            "1,2",
            "--requests",
            "3",
            "--warmup",
            "1",
            "--out",
            str(out_dir),
            "--no-plots",
        ]
        rc, out, err = run_cli(capsys, fake.url, *args, "--api-key", "sekret")
        auth = {r.auth for r in fake.received}
    assert rc == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert set(summary) == {"runs"} and len(summary["runs"]) == 2
    for entry, level in zip(summary["runs"], (1, 2), strict=True):
        assert set(entry) == ENTRY and entry["concurrency"] == level and entry["url"] == fake.url
        assert entry["requests_ok"] == 3 and entry["errors"] == 0 and entry["errors_by_code"] == {}
        assert all(set(entry[k]) == STATS for k in ("ttft_s", "itl_s", "tpot_s", "e2e_s"))
        assert entry["ttft_s"]["p50"] > 0 and entry["output_tok_s"] > 0
    assert auth == {"Bearer sekret"}
    assert "out tok/s" in err and "TTFT" in err  # the table goes to stderr
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["requests_ok"] for r in results["runs"]] == [3, 3]
    assert results["config"]["api_key"] == "(set)" and "sekret" not in (out_dir / "results.json").read_text()
    assert results["servers"][0]["model"] == "fake-model" and results["prompts"]["exact"] is True
    rows = list(csv.DictReader((out_dir / "requests.csv").open()))
    assert len(rows) == 6  # warmup excluded
    assert {r["output_tokens"] for r in rows} == {"4"} and {r["input_tokens"] for r in rows} == {"10"}
    assert not list(out_dir.glob("*.png"))


def test_fail_on_exits_3_and_still_prints_the_summary(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with FakeServer(FakeConfig(ttft=0.01, itl=0.002, faults={3: "500"})) as fake:
        common = ["--requests", "4", "--warmup", "0", "--no-plots"]
        rc, out, err = run_cli(
            capsys, fake.url, *common, "--out", str(tmp_path / "a"), "--fail-on", "error_rate>0"
        )
        rc_ok, _, _ = run_cli(
            capsys, fake.url, *common, "--out", str(tmp_path / "b"), "--fail-on", "ttft_p90>10s"
        )
    assert rc == 3 and "fail-on: error_rate>0 crossed" in err
    assert json.loads(out.strip().splitlines()[-1])["runs"][0]["errors_by_code"] == {"500": 1}
    violations = json.loads((tmp_path / "a" / "results.json").read_text())["fail_on"]["violations"]
    assert violations[0]["threshold"] == "error_rate>0" and violations[0]["observed"] == 0.25
    assert rc_ok == 0


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", "1", "--rate", "2"],
        ["--concurrency", "0"],
        ["--concurrency", "1.5"],
        ["--rate", "fast"],
        ["--fail-on", "bogus>1"],
        ["--fail-on", "errors>1ms"],
        ["--input-tokens", "abc"],
        ["--scenario", "poetry"],
        ["--requests", "0"],
        ["--ramp-up", "-1"],
        ["--ramp-up", "2", "--rate", "1"],
        ["--prompt-file", "/nonexistent/file.txt"],
        ["--endpoint", "embeddings"],
        ["--unknown-flag"],
    ],
)
def test_bad_usage_exits_2_with_one_line(
    args: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    try:
        rc, _, err = run_cli(capsys, "http://127.0.0.1:9", "--out", str(tmp_path), *args)
    except SystemExit as exc:  # argparse's own errors exit from inside the parser
        rc, err = int(exc.code or 0), capsys.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("outpost: error:"), err


def test_unknown_model_is_bad_usage(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with FakeServer(FAST) as fake:
        rc, out, err = run_cli(capsys, fake.url, "--out", str(tmp_path), "--model", "nope")
    assert rc == 2 and "HTTP 404" in err and "--model 'nope'" in err and out == ""


def test_bad_url_and_unreachable_server(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--url", "ftp://host", "--out", str(tmp_path)]) == 2
    with FakeServer() as fake:
        url = fake.url
    rc, out, err = run_cli(capsys, url, "--out", str(tmp_path), "--requests", "1")
    assert rc == 1 and "cannot reach" in err and out == ""


def test_default_out_is_a_timestamped_folder(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with FakeServer(FAST) as fake:
        rc, _, err = run_cli(capsys, fake.url, "--requests", "1", "--warmup", "0", "--no-plots")
    assert rc == 0, err
    (folder,) = (tmp_path / "bench-results").iterdir()
    assert folder.name[:8].isdigit() and (folder / "results.json").is_file()


def legend_texts(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None, "no legend"
    return [t.get_text() for t in legend.get_texts()]


def test_plots_have_labelled_axes_and_a_legend_per_server(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with FakeServer(FAST) as a, FakeServer(FAST) as b:
        result = bench([a.url, b.url], "1,2", 2, output=4)
        rc, _, err = run_cli(
            capsys, a.url, "--compare", b.url, "--requests", "2", "--warmup", "0", "--out", str(tmp_path)
        )
    assert rc == 0 and "ratio" in err  # the ratio table of compared servers
    for name in ("throughput.png", "ttft.png", "latency.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    labels = [s.label for s in result.servers]
    throughput = throughput_figure(result).axes[0]
    assert throughput.get_xlabel() == "concurrent requests (closed loop)"
    assert "tokens/s" in throughput.get_ylabel()
    assert legend_texts(throughput) == labels
    ttft = ttft_figure(result).axes[0]
    assert "(s)" in ttft.get_ylabel()
    assert set(legend_texts(ttft)) == {f"{x} {p}" for x in labels for p in ("p50", "p90")}
    latency = latency_figure(result).axes
    assert all("(ms)" in ax.get_xlabel() or "(s)" in ax.get_xlabel() for ax in latency)
    legend = legend_texts(latency[-1])
    assert legend == [f"{x} @ {lv}" for lv in (1, 2) for x in labels]


def test_fail_on_grammar() -> None:
    t = parse_fail_on("error_rate>1%, ttft_p90>=250ms ,output_tok_s<50,e2e_p99<=3s")
    assert [(x.metric, x.op, x.value) for x in t] == [
        ("error_rate", ">", 0.01),
        ("ttft_p90", ">=", 0.25),
        ("output_tok_s", "<", 50.0),
        ("e2e_p99", "<=", 3.0),
    ]
    assert "itl_p95" in METRICS and "tpot_mean" in METRICS
    for bad in ("ttft>1", "error_rate=0", "output_tok_s<5s", "ttft_p90>2%", "ttft_p90>"):
        with pytest.raises(ValueError):
            parse_fail_on(bad)
