"""What benchmarks/serve/'s several-models scenario reports (issue 43 item 5): cold vs warm time to
first token on one Outpost serving a --models-dir (the load's share of a cold one), and output tok/s,
TTFT and ITL with two models served at once, one Outpost against two llama-server processes; medians
over rounds, ratios measured side by side, as markdown tables, results.json's "models" entry and the
one-line summary. Pure: no server, no I/O but what the caller writes.

Run through serve.py:  python -m benchmarks.serve --scenarios models ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from benchmarks.serve.report import LEVEL_METRICS, _errors, _ratio, median
from benchmarks.serve.tables import _errors as _errors_text
from benchmarks.serve.tables import _ms, _s, _table, _x
from outpost.bench.records import RequestRecord, RunResult, RunSummary
from outpost.bench.stats import summarise

POOL = "outpost"  # one process, both models
PAIR = "llama-server x2"  # one llama-server process per model


@dataclass
class ColdSample:
    """One model in one round: its first request after an unload (load included), the next one
    (loaded), and the load alone (Ollama's empty request after an unload; None: it did not load)."""

    model: str
    round: int
    position: int
    cold: RequestRecord
    warm: RequestRecord
    load_s: float | None


@dataclass
class MultiRun:
    """One setup at one stream count in one round: each model's share of the streams, run at once."""

    server: str
    streams: int
    round: int
    position: int
    runs: dict[str, RunResult]  # model -> its streams' result

    def combined(self) -> RunSummary:
        """Every model's requests as one run: output tokens over the wall time of the slower one."""
        records = [rec for run in self.runs.values() for rec in run.records]
        first = next(iter(self.runs.values())).summary
        return summarise(
            records,
            label=self.server,
            url=first.url,
            model="+".join(self.runs),
            mode="concurrency",
            level=self.streams,
            capped=False,
        )


def split_streams(streams: int, models: list[str]) -> dict[str, int]:
    """`streams` shared out over `models` as evenly as they go, the first ones taking the rest."""
    base, rest = divmod(streams, len(models))
    return {m: base + (i < rest) for i, m in enumerate(models)}


def _ttft(rec: RequestRecord) -> float | None:
    return rec.ttft_s if rec.ok else None


def cold_rows(samples: list[ColdSample]) -> list[dict[str, Any]]:
    """Per model: medians over rounds of the cold and warm TTFT, the load alone, and its share."""
    rows = []
    for model in dict.fromkeys(s.model for s in samples):
        mine = [s for s in samples if s.model == model]
        cold = median([_ttft(s.cold) for s in mine])
        warm = median([_ttft(s.warm) for s in mine])
        load = median([s.load_s for s in mine])
        rows.append(
            {
                "model": model,
                "rounds": len(mine),
                "cold_ttft_s": cold,
                "warm_ttft_s": warm,
                "load_s": load,
                "cold_ttft_s_rounds": [_ttft(s.cold) for s in mine],
                "warm_ttft_s_rounds": [_ttft(s.warm) for s in mine],
                "load_s_rounds": [s.load_s for s in mine],
                "cold_over_warm": _ratio(cold, warm),
                "load_share": _ratio(load, cold),
                "errors": sum(not s.cold.ok for s in mine) + sum(not s.warm.ok for s in mine),
            }
        )
    return rows


def multi_rows(runs: list[MultiRun]) -> list[dict[str, Any]]:
    """Per setup and stream count: the combined run's metrics, medians over rounds (and each round's),
    and each model's output tok/s median."""
    groups: dict[tuple[str, int], list[MultiRun]] = {}
    for r in sorted(runs, key=lambda r: (r.round, r.streams)):
        groups.setdefault((r.server, r.streams), []).append(r)
    order = {POOL: 0, PAIR: 1}
    rows = []
    for (server, streams), group in sorted(groups.items(), key=lambda i: (order.get(i[0][0], 2), i[0])):
        summaries = [g.combined() for g in group]
        row: dict[str, Any] = {"server": server, "streams": streams, "rounds": len(group)}
        for name, get in LEVEL_METRICS.items():
            values = [get(s) for s in summaries]
            row[name], row[f"{name}_rounds"] = median(values), values
        row["per_model_output_tok_s"] = {
            m: median([g.runs[m].summary.output_tok_s for g in group if m in g.runs]) for m in group[0].runs
        }
        rows.append({**row, **_errors(summaries)})
    return rows


def multi_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Outpost (both models in one process) / two llama-servers, per stream count, from the medians."""
    by = {(r["server"], r["streams"]): r for r in rows}
    out = []
    for streams in sorted({r["streams"] for r in rows}):
        ours, base = by.get((POOL, streams)), by.get((PAIR, streams))
        if ours and base:
            out.append(
                {
                    "streams": streams,
                    "output_tok_s": _ratio(ours["output_tok_s"], base["output_tok_s"]),
                    "ttft_p50": _ratio(ours["ttft_p50_s"], base["ttft_p50_s"]),
                    "itl_p50": _ratio(ours["itl_p50_s"], base["itl_p50_s"]),
                }
            )
    return out


def _sample_entry(s: ColdSample) -> dict[str, Any]:
    rec = {"cold": s.cold, "warm": s.warm}
    entry: dict[str, Any] = {"model": s.model, "round": s.round, "position": s.position, "load_s": s.load_s}
    for phase, r in rec.items():
        entry[phase] = {
            "ttft_s": r.ttft_s,
            "e2e_s": r.e2e_s,
            "output_tokens": r.output_tokens,
            "error": r.error,
        }
    return entry


def _run_entry(r: MultiRun) -> dict[str, Any]:
    return {
        "server": r.server,
        "streams": r.streams,
        "round": r.round,
        "position": r.position,
        "combined": r.combined().summary_entry(),
        "per_model": {
            m: {"streams": run.summary.level, **run.summary.summary_entry()} for m, run in r.runs.items()
        },
    }


@dataclass
class ModelsReport:
    """The several-models scenario's findings: filled by benchmarks/serve/models.py."""

    models: dict[str, str]  # name -> what it is (file, synthetic or real)
    threads: str  # how the threads are shared, said in the tables
    servers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # setup -> command lines
    cold: list[ColdSample] = field(default_factory=list)
    multi: list[MultiRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def document(self) -> dict[str, Any]:
        rows = multi_rows(self.multi)
        return {
            "models": self.models,
            "threads": self.threads,
            "servers": self.servers,
            "notes": self.notes,
            "cold_warm": {"rows": cold_rows(self.cold), "samples": [_sample_entry(s) for s in self.cold]},
            "two_models": {
                "rows": rows,
                "ratios": multi_ratios(rows),
                "runs": [_run_entry(r) for r in self.multi],
            },
        }

    def summary(self) -> dict[str, Any]:
        keep = "server streams output_tok_s ttft_p50_s itl_p50_s errors requests".split()
        rows = multi_rows(self.multi)
        return {
            "cold_warm": [
                {k: v for k, v in r.items() if not k.endswith("_rounds")} for r in cold_rows(self.cold)
            ],
            "two_models": [{k: r[k] for k in keep} for r in rows],
            "two_models_ratios": multi_ratios(rows),
        }

    def markdown(self, rounds: int) -> str:
        parts = [
            f"\nSeveral models: {', '.join(f'{m} ({d})' for m, d in self.models.items())}; {self.threads}."
        ]
        if self.cold:
            parts += [f"\nCold vs warm TTFT, one Outpost, 1 stream, medians of {rounds} round(s):\n"]
            parts += cold_table(cold_rows(self.cold))
        rows = multi_rows(self.multi)
        if rows:
            parts += [f"\nTwo models at once (streams split evenly), medians of {rounds} round(s):\n"]
            parts += multi_table(rows)
            if multi_ratios(rows):
                parts += ["", *multi_ratio_table(multi_ratios(rows))]
        for setup, specs in self.servers.items():
            parts += ["", f"{setup}:"] + [f"- `{s['command']}` (weights: {s['layout']})" for s in specs]
        return "\n".join(parts + [f"\n{n}" for n in self.notes])


def _share(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def cold_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        [
            r["model"],
            f"{_s(r['cold_ttft_s'])} s",
            f"{_s(r['warm_ttft_s'])} s",
            _x(r["cold_over_warm"]),
            f"{_s(r['load_s'])} s",
            _share(r["load_share"]),
            str(r["errors"]),
        ]
        for r in rows
    ]
    header = (
        "model|cold TTFT p50 (load included)|warm TTFT p50|cold / warm|load alone|load / cold TTFT|errors"
    )
    return _table(header.split("|"), "lrrrrrr", out)


def multi_table(rows: list[dict[str, Any]]) -> list[str]:
    out = [
        [
            r["server"],
            str(r["streams"]),
            "-" if r["output_tok_s"] is None else f"{r['output_tok_s']:.1f}",
            " / ".join(f"{v:.1f}" if v is not None else "-" for v in r["per_model_output_tok_s"].values()),
            f"{_s(r['ttft_p50_s'])} s",
            f"{_ms(r['itl_p50_s'])} ms",
            _errors_text(r),
        ]
        for r in rows
    ]
    header = ["setup", "streams", "output tok/s", "per model", "TTFT p50", "ITL p50", "errors"]
    return _table(header, "lrrrrrr", out)


def multi_ratio_table(ratios: list[dict[str, Any]]) -> list[str]:
    rows = [[str(r["streams"]), _x(r["output_tok_s"]), _x(r["ttft_p50"]), _x(r["itl_p50"])] for r in ratios]
    return _table(["streams", f"output tok/s, {POOL} / {PAIR}", "TTFT p50", "ITL p50"], "rrrr", rows)
