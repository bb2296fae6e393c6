"""The fault matrix's table (markdown) and plot (faults.png: each scenario's streams, their longest
pause against when they started, the fault's events marked), from cluster/faults.py's results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure

from benchmarks.cluster.faults import FAULT_SCENARIOS

HEADER = [
    "scenario",
    "requests",
    "ok",
    "clear errors",
    "no outcome",
    "dup/missing tokens",
    "503 retried",
    "success % (503 retried)",
    "in flight at fault (ok)",
    "pause p50 / p99 ms (all)",
    "pause p50 / p99 ms (at fault)",
    "fault end to next token p50 / p99 ms (streams)",
]


def _v(x: Any) -> str:
    return "-" if x is None else (f"{x:.1f}" if isinstance(x, float) else str(x))


def _row(name: str, r: dict[str, Any]) -> list[str]:
    if "skipped" in r:
        return [name, f"skipped: {r['skipped']}"] + [""] * (len(HEADER) - 2)
    if "error" in r:
        return [name, f"failed: {r['error'][:80]}"] + [""] * (len(HEADER) - 2)
    if "pause_all" not in r:  # worker-kill-loop: scenario (d)'s fields
        gap = r.get("max_gap_resumed") or {}
        return [
            name,
            _v(r.get("requests")),
            _v(r.get("ok")),
            _v(sum((r.get("errors_by_code") or {}).values())),
            _v(r.get("without_final_outcome")),
            f"{_v(r.get('duplicated_tokens'))}/{_v(r.get('missing_tokens'))}",
            "-",
            _v(r.get("success_pct")),
            f"{len(r.get('kills') or [])} kills",
            f"resumed: {_v(gap.get('p50_ms'))} / {_v(gap.get('p99_ms'))}",
            "",
            "",
        ]
    pa, pf, rg = r["pause_all"], r["pause_at_fault"], r.get("resume_gap") or {}
    return [
        name,
        _v(r["requests"]),
        _v(r["ok"]),
        _v(r["clear_errors"]),
        _v(r["without_final_outcome"]),
        f"{r['duplicated_tokens']}/{r['missing_tokens']}",
        _v(r["refused_503_retried"]),
        _v(r["success_with_retry_pct"]),
        f"{r['in_flight_at_fault']} ({r['in_flight_at_fault_ok']})",
        f"{_v(pa['p50_ms'])} / {_v(pa['p99_ms'])}",
        f"{_v(pf['p50_ms'])} / {_v(pf['p99_ms'])}",
        f"{_v(rg.get('p50_ms'))} / {_v(rg.get('p99_ms'))} ({_v(rg.get('streams'))})",
    ]


def fault_table(results: dict[str, Any]) -> str:
    rows = [_row(n, results[n]) for n in FAULT_SCENARIOS if isinstance(results.get(n), dict)]
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def plot_faults(results: dict[str, Any], out: Path) -> Path | None:
    ran = [n for n in FAULT_SCENARIOS if isinstance(results.get(n), dict) and "timeline" in results[n]]
    ran = [n for n in ran if "t_s" in results[n]["timeline"] and "max_gap_ms" in results[n]["timeline"]]
    if not ran:
        return None
    fig = Figure(figsize=(11, 2.6 * len(ran)))
    for i, name in enumerate(ran):
        r = results[name]
        ax = fig.add_subplot(len(ran), 1, i + 1)
        pts = [(t, g) for t, g in zip(r["timeline"]["t_s"], r["timeline"]["max_gap_ms"], strict=True) if g]
        ax.scatter(
            [p[0] for p in pts], [p[1] for p in pts], s=10, color="C0", label="a stream: longest pause"
        )
        for t, what in r.get("events", []):
            ax.axvline(t, color="C3", alpha=0.5, lw=1)
            ax.text(t, 0, what, rotation=90, fontsize=6, va="bottom", color="C3")
        ax.set_ylabel("ms")
        ok, n = r.get("ok"), r.get("requests")
        ax.set_title(f"{name}: {ok}/{n} ok, {r.get('without_final_outcome')} without an outcome", fontsize=9)
        ax.grid(True, alpha=0.3)
    fig.axes[-1].set_xlabel("stream start (s since the load began)")
    fig.tight_layout()
    path = out / "faults.png"
    fig.savefig(path, dpi=110)
    return path
