"""What benchmarks/serve/ reports: medians over rounds per server and level, Outpost / llama-server
ratios against the issue's targets, the shared-prefix cold/warm figures; as markdown tables (stderr,
for docs/performance.md), results.json, requests.csv, plots and the one-line JSON summary (stdout).

Run through serve.py:  python -m benchmarks.serve ...
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import outpost
from benchmarks.harness.servers import Setup
from outpost.bench.records import RunResult, RunSummary


class ScenarioReport(Protocol):
    """A scenario that reports apart (benchmarks/serve/models_report.py's ModelsReport)."""

    def document(self) -> dict[str, Any]: ...

    def summary(self) -> dict[str, Any]: ...

    def markdown(self, rounds: int) -> str: ...


OURS, BASE = "outpost", "llama-server"
# Outpost / llama-server at these stream counts: output tok/s at least, p50 TTFT and ITL at most
# (issue 47's targets, beside a llama-server on the same kernels)
TOK_S_TARGETS = {1: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
TTFT_TARGETS = {4: 0.7, 8: 0.7, 16: 0.7}
ITL_TARGETS = {4: 1.2, 8: 1.2, 16: 1.2}
PREFIX_TTFT_TARGET = 0.5  # shared-prefix p50 TTFT, cold (the first wave) and warm, at most
# Shared-prefix phases: each stream's first request to a fresh server (every one of them finds the
# cache empty), the fresh server's whole first `--prefix-requests` (the first wave and what the
# streams send next, by then to a warm cache: the measure quoted before the first wave was), and
# the requests after the warmup.
FIRST_WAVE = "cold: first wave"
PREFIX_PHASES = (FIRST_WAVE, "cold", "warm")
PREFIX_TARGETED = (FIRST_WAVE, "warm")
CSV_FIELDS = (
    "scenario server streams round phase index input_tokens prompt_tokens prompt_n cache_n max_tokens "
    "output_tokens ttft_s itl_s e2e_s error"
).split()


@dataclass
class LevelRun:
    """One server at one level in one round; `position`: its place in that level's order."""

    server: str
    level: int
    round: int
    position: int
    run: RunResult


@dataclass
class PrefixRun:
    server: str
    round: int
    position: int
    phase: str  # one of PREFIX_PHASES
    run: RunResult


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _verdict(ratio: float | None, target: float | None, at_least: bool) -> str | None:
    if target is None or ratio is None:
        return None
    return "met" if (ratio >= target if at_least else ratio <= target) else "missed"


def _errors(summaries: Sequence[RunSummary]) -> dict[str, Any]:
    codes: dict[str, int] = {}
    for s in summaries:
        for code, n in s.errors_by_code.items():
            codes[code] = codes.get(code, 0) + n
    total = sum(s.requests_ok + s.errors for s in summaries)
    return {"requests": total, "errors": sum(s.errors for s in summaries), "errors_by_code": codes}


Metric = Callable[[RunSummary], float | None]
LEVEL_METRICS: dict[str, Metric] = {
    "output_tok_s": lambda s: s.output_tok_s if s.requests_ok else None,
    "ttft_p50_s": lambda s: s.ttft_s.p50,
    "ttft_p90_s": lambda s: s.ttft_s.p90,
    "itl_p50_s": lambda s: s.itl_s.p50,
    "itl_p90_s": lambda s: s.itl_s.p90,
}


def _row(keys: dict[str, Any], summaries: list[RunSummary], metrics: dict[str, Metric]) -> dict[str, Any]:
    """Per metric the median over rounds, and every round's value (`<metric>_rounds`)."""
    row = dict(keys, rounds=len(summaries))
    for name, get in metrics.items():
        values = [get(s) for s in summaries]
        row[name], row[f"{name}_rounds"] = median(values), values
    return {**row, **_errors(summaries)}


def level_rows(runs: Sequence[LevelRun]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, int], list[RunSummary]] = {}
    for r in sorted(runs, key=lambda r: (r.round, r.level)):
        groups.setdefault((r.server, r.level), []).append(r.run.summary)
    return [
        _row({"server": k[0], "streams": k[1]}, v, LEVEL_METRICS)
        for k, v in sorted(groups.items(), key=_order)
    ]


def _order(item: tuple[tuple[str, Any], Any]) -> tuple[int, str, Any]:
    (server, key), _ = item
    return ([OURS, BASE].index(server) if server in (OURS, BASE) else 2, server, key)


def level_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outpost / llama-server per stream count, from the medians, with the targets."""
    by = {(r["server"], r["streams"]): r for r in rows}
    out = []
    for level in sorted({r["streams"] for r in rows}):
        ours, base = by.get((OURS, level)), by.get((BASE, level))
        if ours is None or base is None:
            continue
        tok = _ratio(ours["output_tok_s"], base["output_tok_s"])
        ttft = _ratio(ours["ttft_p50_s"], base["ttft_p50_s"])
        itl = _ratio(ours["itl_p50_s"], base["itl_p50_s"])
        out.append(
            {
                "streams": level,
                "output_tok_s": tok,
                "output_tok_s_target": TOK_S_TARGETS.get(level),
                "output_tok_s_verdict": _verdict(tok, TOK_S_TARGETS.get(level), at_least=True),
                "ttft_p50": ttft,
                "ttft_p50_target": TTFT_TARGETS.get(level),
                "ttft_p50_verdict": _verdict(ttft, TTFT_TARGETS.get(level), at_least=False),
                "itl_p50": itl,
                "itl_p50_target": ITL_TARGETS.get(level),
                "itl_p50_verdict": _verdict(itl, ITL_TARGETS.get(level), at_least=False),
            }
        )
    return out


def _mean(values: Sequence[int | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


PREFIX_METRICS: dict[str, Metric] = {
    "ttft_p50_s": lambda s: s.ttft_s.p50,
    "ttft_p90_s": lambda s: s.ttft_s.p90,
}


def prefix_rows(runs: Sequence[PrefixRun]) -> list[dict[str, Any]]:
    """Per server and phase: TTFT medians over rounds; prompt tokens evaluated (`prompt_n`) and
    reused (`cache_n`) per successful request, means over every round's requests."""
    groups: dict[tuple[str, str], list[PrefixRun]] = {}
    for r in sorted(runs, key=lambda r: r.round):
        groups.setdefault((r.server, r.phase), []).append(r)
    rows = []
    for (server, phase), group in sorted(groups.items(), key=_order):
        row = _row({"server": server, "phase": phase}, [g.run.summary for g in group], PREFIX_METRICS)
        records = [rec for g in group for rec in g.run.records if rec.ok]
        row["prompt_n_mean"] = _mean([rec.prompt_n for rec in records])
        row["cache_n_mean"] = _mean([rec.cache_n for rec in records])
        rows.append(row)
    return rows


def prefix_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(r["server"], r["phase"]): r for r in rows}
    out = []
    for phase in PREFIX_PHASES:
        ours, base = by.get((OURS, phase)), by.get((BASE, phase))
        if ours and base:
            ttft = _ratio(ours["ttft_p50_s"], base["ttft_p50_s"])
            target = PREFIX_TTFT_TARGET if phase in PREFIX_TARGETED else None
            verdict = _verdict(ttft, target, at_least=False)
            out.append({"phase": phase, "ttft_p50": ttft, "target": target, "verdict": verdict})
    return out


def _run_entry(r: LevelRun | PrefixRun) -> dict[str, Any]:
    """One server, level or phase, round in results.json: `outpost bench`'s summary entry, and for the
    shared prefix the mean prompt tokens evaluated / reused per successful request."""
    entry: dict[str, Any] = {"server": r.server, "round": r.round, "position": r.position}
    if isinstance(r, LevelRun):
        return {**entry, "streams": r.level, **r.run.summary.summary_entry()}
    ok = [rec for rec in r.run.records if rec.ok]
    entry.update(phase=r.phase, prompt_n_mean=_mean([rec.prompt_n for rec in ok]))
    entry["cache_n_mean"] = _mean([rec.cache_n for rec in ok])
    return {**entry, **r.run.summary.summary_entry()}


@dataclass
class Report:
    """Everything one run of serve.py found; filled by the scenarios, written at the end."""

    args: argparse.Namespace
    setup: Setup
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # throughput command lines
    prefix_servers: dict[str, dict[str, Any]] = field(default_factory=dict)  # shared-prefix ones
    failed: dict[str, str] = field(default_factory=dict)  # servers that did not start
    notes: list[str] = field(default_factory=list)
    level_runs: list[LevelRun] = field(default_factory=list)
    prefix_runs: list[PrefixRun] = field(default_factory=list)
    models: ScenarioReport | None = None  # the several-models scenario (benchmarks/serve/models.py)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def setup_text(self) -> str:
        s, a = self.setup, self.args
        pin = f"pinned to CPUs {s.cpus}" if s.cpus else "not pinned"
        lcp_levels = ",".join(map(str, a.llama_cpp_python_levels))
        return (
            f"{s.model.name}, -t {s.threads}, -np {s.parallel}, -c {s.ctx}"
            f"{f', -ngl {s.n_gpu_layers}' if s.n_gpu_layers else ''}, servers {pin}; "
            f"{a.rounds} round(s), levels {','.join(map(str, a.levels))}; llama-cpp-python's server "
            f"(one request at a time, it cuts the other streams) at {lcp_levels} streams only"
        )

    def plan_text(self, kinds: list[str]) -> str:
        return f"servers: {', '.join(kinds)}\n{self.setup_text()}"

    def summary(self) -> dict[str, Any]:
        """The last stdout line: medians, ratios and verdicts, no per-round detail."""
        keep = "server streams phase output_tok_s ttft_p50_s ttft_p90_s itl_p50_s errors requests"
        keep += " prompt_n_mean cache_n_mean"
        rows = level_rows(self.level_runs)
        prefix = prefix_rows(self.prefix_runs)
        ratios = level_ratios(rows) + prefix_ratios(prefix)
        verdicts = [v for r in ratios for k, v in r.items() if k.endswith("verdict") and v]
        return {
            "out": str(self.args.out),
            "throughput": [{k: r[k] for k in keep.split() if k in r} for r in rows],
            "shared_prefix": [{k: r[k] for k in keep.split() if k in r} for r in prefix],
            "ratios": level_ratios(rows),
            "shared_prefix_ratios": prefix_ratios(prefix),
            "targets": {"met": verdicts.count("met"), "missed": verdicts.count("missed")},
            "failed": self.failed,
            **({"models": self.models.summary()} if self.models else {}),
        }

    def document(self) -> dict[str, Any]:
        rows, prefix = level_rows(self.level_runs), prefix_rows(self.prefix_runs)
        runs = [_run_entry(r) for r in self.level_runs]
        pruns = [_run_entry(r) for r in self.prefix_runs]
        args = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(self.args).items()}
        return {
            "tool": "benchmarks.serve",
            "version": outpost.__version__,
            "started": self.started,
            "args": args,
            "setup": self.setup_text(),
            "servers": self.servers,
            "shared_prefix_servers": self.prefix_servers,
            "failed": self.failed,
            "notes": self.notes,
            "throughput": {"rows": rows, "ratios": level_ratios(rows), "runs": runs},
            "shared_prefix": {"rows": prefix, "ratios": prefix_ratios(prefix), "runs": pruns},
            **({"models": self.models.document()} if self.models else {}),
        }

    def write(self, out: Path) -> None:
        (out / "results.json").write_text(json.dumps(self.document(), indent=2, default=str) + "\n")
        self.write_csv(out / "requests.csv")

    def write_csv(self, path: Path) -> None:
        rows = [("throughput", r.server, r.level, r.round, "measured", r.run) for r in self.level_runs]
        rows += [
            ("shared-prefix", r.server, self.args.prefix_streams, r.round, r.phase, r.run)
            for r in self.prefix_runs
        ]
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            writer.writeheader()
            for scenario, server, streams, rnd, phase, run in rows:
                for rec in run.records:
                    fields = {k: getattr(rec, k) for k in CSV_FIELDS if hasattr(rec, k)}
                    writer.writerow(
                        {
                            **fields,
                            "scenario": scenario,
                            "server": server,
                            "streams": streams,
                            "round": rnd,
                            "phase": phase,
                        }
                    )
