"""benchmarks/serve/'s markdown tables (printed to stderr, ready for docs/performance.md): medians per
server and level, Outpost / llama-server ratios with the targets marked met/missed, the shared-prefix
cold/warm table, and the exact command line each server got.

Run through serve.py:  python -m benchmarks.serve ...
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.serve.report import BASE, OURS, level_ratios, level_rows, prefix_ratios, prefix_rows

if TYPE_CHECKING:
    from benchmarks.serve.report import Report


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}" if v < 0.1 else f"{v:.2f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.1f}" if v < 0.01 else f"{v * 1000:.0f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _tokens(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _errors(row: dict[str, Any]) -> str:
    codes = ", ".join(f"{code} {n}" for code, n in row["errors_by_code"].items())
    return f"{row['errors']} of {row['requests']}" + (f" ({codes})" if codes else "")


def _target(target: float | None, verdict: str | None, sign: str) -> str:
    if target is None:
        return "-"
    return f"{sign} {target:.1f}x: **{verdict}**" if verdict else f"{sign} {target:.1f}x: -"


def _table(header: list[str], align: str, rows: list[list[str]]) -> list[str]:
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
    ]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _spread(values: list[float | None]) -> str:
    present = [v for v in values if v is not None]
    return f" ({min(present):.1f}-{max(present):.1f})" if len(present) > 1 else ""


def throughput_table(rows: list[dict[str, Any]]) -> list[str]:
    out, last = [], None
    for r in rows:
        first = r["server"] != last
        last = r["server"]
        out.append(
            [
                r["server"] if first else "",
                str(r["streams"]),
                f"{r['output_tok_s']:.1f}{_spread(r['output_tok_s_rounds'])}" if r["output_tok_s"] else "-",
                f"{_s(r['ttft_p50_s'])} / {_s(r['ttft_p90_s'])} s",
                f"{_ms(r['itl_p50_s'])} / {_ms(r['itl_p90_s'])} ms",
                _errors(r),
            ]
        )
    header = [
        "server",
        "streams",
        "output tok/s (rounds' range)",
        "TTFT p50 / p90",
        "ITL p50 / p90",
        "errors",
    ]
    return _table(header, "lrrrrr", out)


def ratio_table(ratios: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            str(r["streams"]),
            _x(r["output_tok_s"]),
            _target(r["output_tok_s_target"], r["output_tok_s_verdict"], ">="),
            _x(r["ttft_p50"]),
            _target(r["ttft_p50_target"], r["ttft_p50_verdict"], "<="),
            _x(r.get("itl_p50")),
            _target(r.get("itl_p50_target"), r.get("itl_p50_verdict"), "<="),
        ]
        for r in ratios
    ]
    header = ["streams", f"output tok/s, {OURS} / {BASE}", "target"]
    header += ["TTFT p50", "target", "ITL p50", "target"]
    return _table(header, "rrlrlrl", rows)


def prefix_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        [
            r["server"],
            r["phase"],
            f"{_s(r['ttft_p50_s'])} / {_s(r['ttft_p90_s'])} s",
            f"{_tokens(r['prompt_n_mean'])} / {_tokens(r['cache_n_mean'])}",
            _errors(r),
        ]
        for r in rows
    ]
    header = ["server", "start", "TTFT p50 / p90", "prompt tokens evaluated / reused, per request", "errors"]
    return _table(header, "llrrr", out)


def prefix_ratio_table(ratios: list[dict[str, Any]]) -> list[str]:
    rows = [[r["phase"], _x(r["ttft_p50"]), _target(r["target"], r["verdict"], "<=")] for r in ratios]
    return _table(["start", f"TTFT p50, {OURS} / {BASE}", "target"], "lrl", rows)


def _commands(title: str, servers: dict[str, dict[str, Any]]) -> list[str]:
    lines = [title]
    for label, spec in servers.items():
        lines.append(
            f"- {label}: `{spec['command']}` (weights: {spec['layout']}; {'; '.join(spec['notes'])})"
        )
    return lines


def markdown_tables(report: Report) -> str:
    a = report.args
    only_models = report.models is not None and not report.level_runs and not report.prefix_runs
    parts = [] if only_models else [f"Setup: {report.setup_text()}."]
    rows = level_rows(report.level_runs)
    if rows:
        parts += [f"\nThroughput, medians of {a.rounds} round(s):\n", *throughput_table(rows)]
        ratios = level_ratios(rows)
        if ratios:
            parts += ["", *ratio_table(ratios)]
    prefix = prefix_rows(report.prefix_runs)
    if prefix:
        head = f"\nShared prefix ({a.prefix_streams} streams, one ~500-token system prompt), medians of"
        head += f" {a.rounds} round(s); cold: first wave: each stream's first request to a fresh server;"
        head += f" cold: the fresh server's first {a.prefix_requests} requests; warm:"
        parts += [f"{head} after {a.prefix_warmup} more:\n", *prefix_table(prefix)]
        if prefix_ratios(prefix):
            parts += ["", *prefix_ratio_table(prefix_ratios(prefix))]
    if report.servers:
        parts += ["", *_commands("Throughput servers:", report.servers)]
    if report.prefix_servers:
        parts += [
            "",
            *_commands("Shared-prefix servers (each freshly started per round):", report.prefix_servers),
        ]
    if report.models:
        parts.append(report.models.markdown(a.rounds))
    parts += [f"\n{label} did not start: {why}" for label, why in report.failed.items()]
    parts += [f"\n{note}" for note in report.notes]
    return "\n".join(parts)
