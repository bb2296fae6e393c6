"""benchmarks/serve/'s several-models scenario, its pure parts on a small fake result: the streams'
split, the cold/warm and two-models rows (medians, the load's share, combined throughput, ratios),
the markdown tables, results.json's entry, the plot, and the shared progress bar."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from benchmarks.harness.servers import Setup
from benchmarks.serve.models import SharedProgress
from benchmarks.serve.models_report import (
    PAIR,
    POOL,
    ColdSample,
    ModelsReport,
    MultiRun,
    cold_rows,
    multi_ratios,
    multi_rows,
    split_streams,
)
from benchmarks.serve.report import Report
from outpost.bench.records import RequestRecord, RunResult
from outpost.bench.stats import summarise


def rec(index: int, ttft: float, e2e: float, tokens: int = 10, start: float = 0.0) -> RequestRecord:
    return RequestRecord(
        index, start, 8, tokens, ttft_s=ttft, last_token_s=e2e, e2e_s=e2e, chunks=tokens, done=True
    )


def run(label: str, streams: int, records: list[RequestRecord]) -> RunResult:
    summary = summarise(
        records, label=label, url="http://x", model="m", mode="concurrency", level=streams, capped=False
    )
    return RunResult(summary, records)


def fake_report() -> ModelsReport:
    report = ModelsReport({"a": "a.gguf", "b": "b.gguf"}, "-t 1 per model")
    for r, (cold, warm, load) in enumerate([(1.0, 0.1, 0.8), (1.2, 0.2, 0.9), (3.0, 0.3, None)]):
        report.cold.append(ColdSample("a", r, 0, rec(0, cold, cold + 1), rec(1, warm, warm + 1), load))
        report.cold.append(ColdSample("b", r, 1, rec(0, 2 * cold, 3), rec(1, warm, 2), load))
    for r in range(2):
        for streams in (2, 4):
            # Outpost: both models' 10 tokens in 2 s; the pair: in 4 s (the slower model sets the time)
            ours = {m: run(POOL, streams // 2, [rec(0, 0.1, 2.0)]) for m in "ab"}
            pair = {"a": run(PAIR, streams // 2, [rec(0, 0.2, 2.0)]), "b": run(PAIR, 1, [rec(0, 0.4, 4.0)])}
            report.multi += [MultiRun(POOL, streams, r, 0, ours), MultiRun(PAIR, streams, r, 1, pair)]
    return report


def test_split_streams_shares_out_evenly() -> None:
    assert split_streams(4, ["a", "b"]) == {"a": 2, "b": 2}
    assert split_streams(5, ["a", "b"]) == {"a": 3, "b": 2}
    assert split_streams(1, ["a", "b"]) == {"a": 1, "b": 0}


def test_cold_rows_medians_and_load_share() -> None:
    rows = {r["model"]: r for r in cold_rows(fake_report().cold)}
    a = rows["a"]
    assert a["rounds"] == 3 and a["errors"] == 0
    assert a["cold_ttft_s"] == pytest.approx(1.2) and a["warm_ttft_s"] == pytest.approx(0.2)
    assert a["load_s"] == pytest.approx(0.85)  # the round that did not load is left out
    assert a["load_share"] == pytest.approx(0.85 / 1.2) and a["cold_over_warm"] == pytest.approx(6.0)
    assert a["load_s_rounds"] == [0.8, 0.9, None]


def test_a_failed_request_is_an_error_not_a_ttft() -> None:
    failed = RequestRecord(0, 0.0, 8, 10, error="500")
    rows = cold_rows([ColdSample("a", 0, 0, failed, rec(1, 0.1, 1.0), 0.5)])
    assert rows[0]["errors"] == 1 and rows[0]["cold_ttft_s"] is None and rows[0]["load_share"] is None


def test_multi_rows_combine_both_models_and_ratio() -> None:
    rows = multi_rows(fake_report().multi)
    assert [(r["server"], r["streams"]) for r in rows] == [(POOL, 2), (POOL, 4), (PAIR, 2), (PAIR, 4)]
    ours, pair = rows[0], rows[2]
    assert ours["output_tok_s"] == pytest.approx(20 / 2.0)  # 2 x 10 tokens over 2 s
    assert pair["output_tok_s"] == pytest.approx(20 / 4.0)
    assert ours["requests"] == 4 and ours["errors"] == 0  # 2 rounds x 2 models
    assert pair["per_model_output_tok_s"] == {"a": pytest.approx(5.0), "b": pytest.approx(2.5)}
    ratios = {r["streams"]: r for r in multi_ratios(rows)}
    assert ratios[2]["output_tok_s"] == pytest.approx(2.0)
    assert ratios[4]["ttft_p50"] == pytest.approx(0.1 / 0.3)  # p50 of 0.2 and 0.4


def test_markdown_document_and_summary() -> None:
    report = fake_report()
    text = report.markdown(rounds=2)
    assert "| a | 1.20 s | 0.20 s | 6.00x | 0.85 s | 71% | 0 |" in text
    assert f"| {PAIR} | 2 | 5.0 | 5.0 / 2.5 |" in text
    assert "| 2 | 2.00x |" in text
    doc = json.loads(json.dumps(report.document(), default=str))
    assert set(doc) >= {"models", "threads", "cold_warm", "two_models"}
    assert len(doc["cold_warm"]["samples"]) == 6 and len(doc["two_models"]["runs"]) == 8
    assert doc["two_models"]["runs"][0]["per_model"]["a"]["streams"] == 1
    assert {r["streams"] for r in report.summary()["two_models_ratios"]} == {2, 4}


def test_models_plot_is_written(tmp_path: Path) -> None:
    from benchmarks.serve.plots import write_plots

    args = argparse.Namespace(rounds=2, prefix_streams=8, out=tmp_path)
    report = Report(args, Setup(Path("m.gguf"), 1, 2, None, None))
    report.models = fake_report()
    assert write_plots(report, tmp_path) == [tmp_path / "models.png"]
    assert (tmp_path / "models.png").stat().st_size > 10_000


def test_shared_progress_draws_one_bar_for_both_models() -> None:
    progress = SharedProgress(2)
    progress.stream, progress.tty = io.StringIO(), False
    progress.start("outpost c=1", 3, None)
    progress.start("outpost c=1", 2, None)
    for i in range(5):
        progress.update(rec(i, 0.1, 1.0))
    progress.finish()
    assert progress.stream.getvalue() == ""  # the other model's run is not done yet
    progress.finish()
    assert "5/5 ok 5 err 0" in progress.stream.getvalue()
