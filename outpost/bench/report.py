"""Turning a `BenchResult` into what people and machines read: the terminal table and ratio table
(stderr), `results.json`, `requests.csv` (one row per measured request) and the one-line JSON
summary (the last line of stdout)."""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import outpost
from outpost.bench.config import BenchConfig
from outpost.bench.failon import Threshold, Violation
from outpost.bench.records import BenchResult, RunSummary

CSV_FIELDS = (
    "server url model mode level index start_s input_tokens prompt_tokens prompt_n cache_n draft_n "
    "draft_n_accepted max_tokens output_tokens chunks "
    "ttft_s itl_s tpot_s e2e_s output_tok_s finish_reason status error error_detail"
).split()


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v * 1000:.1f}" if v < 0.01 else f"{v * 1000:.0f}"  # a fast server's ITL is a few ms


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def _row(r: RunSummary) -> list[str]:
    return [
        r.label,
        f"{r.level:g}",
        str(r.requests_ok),
        str(r.errors),
        f"{r.output_tok_s:.1f}",
        f"{r.requests_per_s:.2f}",
        f"{_s(r.ttft_s.p50)} / {_s(r.ttft_s.p90)}",
        f"{_ms(r.itl_s.p50)} / {_ms(r.itl_s.p90)}",
        _ms(r.tpot_s.p50),
        f"{_s(r.e2e_s.p50)} / {_s(r.e2e_s.p90)}",
    ]


def _grid(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(c) for c in col) for col in zip(header, *rows, strict=True)]
    lines = [
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in [header, *rows]
    ]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def format_table(result: BenchResult) -> str:
    """One row per server and level; times as p50 / p90."""
    if not result.runs:
        return "(no runs)"
    level = "concurrency" if result.runs[0].summary.mode == "concurrency" else "rate/s"
    header = [
        "server",
        level,
        "ok",
        "errors",
        "out tok/s",
        "req/s",
        "TTFT s",
        "ITL ms",
        "TPOT ms",
        "e2e s",
    ]
    table = _grid(header, [_row(r.summary) for r in result.runs])
    notes = [
        f"errors at {r.summary.label} {r.summary.level:g}: {r.summary.errors_by_code}"
        for r in result.runs
        if r.summary.errors
    ]
    notes += [
        f"{r.summary.label} {r.summary.level:g}: ran out of requests before --duration (raise --requests)"
        for r in result.runs
        if r.summary.capped
    ]
    return "\n".join([table, *notes])


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"x{a / b:.2f}"


def format_ratios(result: BenchResult) -> str | None:
    """Each compared server against the first (--url), level by level; None with one server."""
    if len(result.servers) < 2:
        return None
    base_label = result.servers[0].label
    base = {r.summary.level: r.summary for r in result.runs if r.summary.label == base_label}
    rows = []
    for r in (run.summary for run in result.runs if run.summary.label != base_label):
        b = base.get(r.level)
        if b is None:
            continue
        rows.append(
            [
                f"{r.label} / {base_label}",
                f"{r.level:g}",
                _ratio(r.output_tok_s, b.output_tok_s),
                _ratio(r.ttft_s.p50, b.ttft_s.p50),
                _ratio(r.ttft_s.p90, b.ttft_s.p90),
                _ratio(r.itl_s.p50, b.itl_s.p50),
                _ratio(r.e2e_s.p50, b.e2e_s.p50),
            ]
        )
    header = ["ratio", "level", "out tok/s", "TTFT p50", "TTFT p90", "ITL p50", "e2e p50"]
    return _grid(header, rows)


def format_tables(result: BenchResult) -> str:
    """The table, then the ratio table when servers were compared."""
    ratios = format_ratios(result)
    return format_table(result) + (f"\n\n{ratios}" if ratios else "")


def summary_line(result: BenchResult) -> str:
    return json.dumps({"runs": [r.summary.summary_entry() for r in result.runs]}, separators=(",", ":"))


def _run_json(r: RunSummary) -> dict[str, Any]:
    extra = {
        "label": r.label,
        "model": r.model,
        "error_rate": r.error_rate,
        "duration_s": r.duration_s,
        "total_tok_s": r.total_tok_s,
        "request_output_tok_s": r.request_output_tok_s.as_dict(),
        "input_tokens_mean": r.input_tokens_mean,
        "output_tokens_mean": r.output_tokens_mean,
        "capped": r.capped,
    }
    return {**r.summary_entry(), **extra}


def results_json(
    result: BenchResult, config: BenchConfig, thresholds: Sequence[Threshold], violations: Sequence[Violation]
) -> dict[str, Any]:
    return {
        "tool": "outpost bench",
        "version": outpost.__version__,
        "config": {**asdict(config), "api_key": "(set)" if config.api_key else None},  # never the key
        "prompts": asdict(result.prompts),
        "servers": [asdict(s) for s in result.servers],
        "runs": [_run_json(r.summary) for r in result.runs],
        "fail_on": {
            "thresholds": [t.text for t in thresholds],
            "violations": [asdict(v) for v in violations],
        },
    }


def write_results(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")


def write_requests_csv(path: Path, result: BenchResult) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for run in result.runs:
            s = run.summary
            for rec in run.records:
                writer.writerow(
                    {
                        "server": s.label,
                        "url": s.url,
                        "model": s.model,
                        "mode": s.mode,
                        "level": s.level,
                        "index": rec.index,
                        "start_s": rec.start_s,
                        "input_tokens": rec.input_tokens,
                        "prompt_tokens": rec.prompt_tokens,
                        "prompt_n": rec.prompt_n,
                        "cache_n": rec.cache_n,
                        "draft_n": rec.draft_n,
                        "draft_n_accepted": rec.draft_n_accepted,
                        "max_tokens": rec.max_tokens,
                        "output_tokens": rec.output_tokens,
                        "chunks": rec.chunks,
                        "ttft_s": rec.ttft_s,
                        "itl_s": rec.itl_s,
                        "tpot_s": rec.tpot_s,
                        "e2e_s": rec.e2e_s,
                        "output_tok_s": rec.output_tok_s,
                        "finish_reason": rec.finish_reason,
                        "status": rec.status,
                        "error": rec.error,
                        "error_detail": rec.error_detail,
                    }
                )


def write_outputs(
    out: Path,
    result: BenchResult,
    config: BenchConfig,
    thresholds: Sequence[Threshold],
    violations: Sequence[Violation],
    *,
    plots: bool = True,
) -> list[Path]:
    """results.json, requests.csv and (with `plots`) the PNGs into `out`; returns the paths."""
    write_results(out / "results.json", results_json(result, config, thresholds, violations))
    write_requests_csv(out / "requests.csv", result)
    written = [out / "results.json", out / "requests.csv"]
    if plots:
        from outpost.bench.plots import write_plots  # matplotlib is slow to import: only when plotting

        written += write_plots(result, out)
    return written
