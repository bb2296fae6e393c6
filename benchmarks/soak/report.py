"""The soak's verdict and outputs (benchmarks/soak/): pass criteria, the stderr table,
results.json and soak.png. Part of the soak benchmark, not run on its own.

Pass criteria: no 5xx (any response on any path, plus `{"error"}` events inside 200 streams), no
request lost, no slot busy once the load stopped (polled for a bounded time), RSS growth after
warmup < 2% (end against the first sample after the warmup), no unexpected answer (a valid
request refused, a bad one served, a 429 without Retry-After), and the server we started still
running.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from benchmarks.soak.kinds import CANCELLED, LOST, OK, OUTCOMES, STREAM_ERR, UNEXPECTED, Result, StatusTally
from outpost.bench.stats import percentile

RSS_GROWTH_LIMIT_PCT = 2.0
MIB = 1024 * 1024


@dataclass(frozen=True)
class Sample:
    """The server seen by the monitor at `t_s` seconds into the load (None: not measurable)."""

    t_s: float
    rss_bytes: int | None
    slots_busy: int | None
    queue_depth: int | None


@dataclass(frozen=True)
class Settle:
    """/health once the load stopped: the last figures read and how long it took to go idle."""

    slots_busy: int | None
    queue_depth: int | None
    seconds: float
    idle: bool


@dataclass
class SoakData:
    config: dict[str, Any]
    planned_s: float  # --duration: no request starts after it
    primed_s: float  # the priming pass (one request of each kind) ended
    duration_s: float  # from the first request to the end of the last
    warmup_s: float
    results: list[Result]
    samples: list[Sample]
    rss_start: int | None
    rss_warm: int | None
    rss_end: int | None
    settle: Settle
    tally: StatusTally
    bursts: list[int] = field(default_factory=list)  # 429s in each overload burst
    server_exit: int | None = None  # the server we started died with this code


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def ttft_tenths(results: list[Result], start: float, end: float) -> dict[str, Any]:
    """TTFT p50/p99 of the streamed chats that started in the first and in the last tenth of the
    mixed load (from the end of the priming pass, which runs one request at a time, to --duration)."""
    ok = [r for r in results if r.kind == "stream_chat" and r.outcome == OK and r.ttft_s is not None]
    tenth = (end - start) / 10
    out: dict[str, Any] = {"window_s": [round(start, 1), round(end, 1)]}
    for name, lo, hi in (("first_tenth", start, start + tenth), ("last_tenth", end - tenth, end)):
        values = sorted(r.ttft_s for r in ok if lo <= r.start_s < hi and r.ttft_s is not None)
        out[name] = {
            "n": len(values),
            "p50_s": round(percentile(values, 50), 4) if values else None,
            "p99_s": round(percentile(values, 99), 4) if values else None,
        }
    first, last = out["first_tenth"]["p99_s"], out["last_tenth"]["p99_s"]
    out["p99_last_over_first"] = round(last / first, 3) if first and last else None
    return out


def rss_summary(data: SoakData) -> dict[str, Any]:
    after = [s for s in data.samples if s.t_s >= data.warmup_s and s.rss_bytes is not None]
    growth = None
    if data.rss_warm and data.rss_end:
        growth = round(100.0 * (data.rss_end - data.rss_warm) / data.rss_warm, 3)
    return {
        "start_mib": _mib(data.rss_start),
        "warm_mib": _mib(data.rss_warm),
        "end_mib": _mib(data.rss_end),
        "peak_after_warmup_mib": _mib(max((s.rss_bytes or 0 for s in after), default=None)),
        "growth_after_warmup_pct": growth,
        "slope_after_warmup_mib_per_h": _slope_mib_per_h(after),
    }


def _slope_mib_per_h(samples: list[Sample]) -> float | None:
    """Least-squares trend of RSS over the samples: a leak shows as a steady climb."""
    points = [(s.t_s, s.rss_bytes / MIB) for s in samples if s.rss_bytes is not None]
    if len(points) < 3:
        return None
    mx = sum(t for t, _ in points) / len(points)
    my = sum(v for _, v in points) / len(points)
    var = sum((t - mx) ** 2 for t, _ in points)
    if var == 0:
        return None
    return round(3600 * sum((t - mx) * (v - my) for t, v in points) / var, 2)


def criteria(data: SoakData, outcomes: Counter[str], rss: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each pass criterion: its value and whether it passed (None: could not be measured)."""
    five = sum(n for status, n in data.tally.by_status.items() if status >= 500)
    lost = sum(outcomes[o] for o in LOST)
    unexpected = outcomes[UNEXPECTED] + data.tally.no_retry_after
    growth = rss["growth_after_warmup_pct"]
    busy = data.settle.slots_busy
    return {
        "5xx": {"value": five + outcomes[STREAM_ERR], "pass": five + outcomes[STREAM_ERR] == 0},
        "lost": {"value": lost, "pass": lost == 0},
        "slots_busy_after": {"value": busy, "pass": None if busy is None else busy == 0},
        "rss_growth_pct": {
            "value": growth,
            "pass": None if growth is None else growth < RSS_GROWTH_LIMIT_PCT,
        },
        "unexpected": {"value": unexpected, "pass": unexpected == 0},
        "server_exit": {"value": data.server_exit, "pass": data.server_exit is None},
    }


def summarise(data: SoakData, out: Path) -> dict[str, Any]:
    """The run in one dict: the stdout summary line and results.json's `summary`."""
    outcomes = Counter(r.outcome for r in data.results)
    by_kind: dict[str, Counter[str]] = {}
    for r in data.results:
        by_kind.setdefault(r.kind, Counter())[r.outcome] += 1
    rss = rss_summary(data)
    checks = criteria(data, outcomes, rss)
    cancels = Counter(r.detail for r in data.results if r.outcome == CANCELLED)
    return {
        "pass": all(c["pass"] is not False for c in checks.values()),
        "criteria": checks,
        "duration_s": round(data.duration_s, 1),
        "warmup_s": round(data.warmup_s, 1),
        "requests": len(data.results),
        "by_outcome": {o: outcomes[o] for o in OUTCOMES if outcomes[o]},
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "lost": {o: outcomes[o] for o in LOST},
        "responses_by_status": {str(k): v for k, v in sorted(data.tally.by_status.items())},
        "status_429_without_retry_after": data.tally.no_retry_after,
        "cancelled": dict(cancels),
        "bursts": {"count": len(data.bursts), "with_429": sum(1 for n in data.bursts if n)},
        "slots_busy_after": data.settle.slots_busy,
        "queue_depth_after": data.settle.queue_depth,
        "idle_after_s": round(data.settle.seconds, 2) if data.settle.idle else None,
        "rss": rss,
        "ttft_stream_chat": ttft_tenths(data.results, data.primed_s, data.planned_s),
        "server_exit": data.server_exit,
        "out": str(out),
    }


def format_table(summary: dict[str, Any]) -> str:
    """Requests by kind and outcome, then the criteria, for stderr."""
    cols = [o for o in OUTCOMES if summary["by_outcome"].get(o)]
    width = max([len(k) for k in summary["by_kind"]] + [5])
    lines = [f"{'kind':<{width}}  " + "  ".join(f"{c:>{max(len(c), 5)}}" for c in cols)]
    rows = [*summary["by_kind"].items(), ("total", summary["by_outcome"])]
    for kind, counts in rows:
        cells = "  ".join(f"{counts.get(c, 0):>{max(len(c), 5)}}" for c in cols)
        lines.append(f"{kind:<{width}}  {cells}")
    rss, ttft = summary["rss"], summary["ttft_stream_chat"]
    lines += [
        "",
        f"requests {summary['requests']} in {summary['duration_s']} s; bursts {summary['bursts']}",
        f"cancelled: {summary['cancelled']}; lost: {summary['lost']}",
        f"RSS MiB: start {rss['start_mib']}, after warmup {rss['warm_mib']}, end {rss['end_mib']}, "
        f"peak {rss['peak_after_warmup_mib']}; trend {rss['slope_after_warmup_mib_per_h']} MiB/h",
        f"TTFT streamed chat p50/p99, tenths of the mixed load {ttft['window_s']} s: first "
        f"{_pair(ttft['first_tenth'])}, last {_pair(ttft['last_tenth'])}",
        f"idle after the load: {summary['idle_after_s']} s",
        "",
    ]
    for name, check in summary["criteria"].items():
        verdict = {True: "PASS", False: "FAIL", None: "n/a"}[check["pass"]]
        lines.append(f"{verdict:<4}  {name}: {check['value']}")
    lines.append("PASS" if summary["pass"] else "FAIL")
    return "\n".join(lines)


def _pair(tenth: dict[str, Any]) -> str:
    return f"{tenth['p50_s']}/{tenth['p99_s']} s (n={tenth['n']})"


def failures(results: list[Result], per_outcome: int = 20) -> dict[str, list[dict[str, Any]]]:
    """The first requests of each bad outcome, with their details, for bug reports."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if r.outcome in (*LOST, UNEXPECTED, STREAM_ERR, "5xx"):
            bucket = out.setdefault(r.outcome, [])
            if len(bucket) < per_outcome:
                bucket.append(asdict(r))
    return out


def write_outputs(out: Path, data: SoakData, summary: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": data.config,
        "summary": summary,
        "failures": failures(data.results),
        "server_errors_seen": data.tally.server_errors,
        "samples": [asdict(s) for s in data.samples],
        "requests": [asdict(r) for r in data.results],
    }
    (out / "results.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(out / "soak.png", data, summary)


def plot(path: Path, data: SoakData, summary: dict[str, Any]) -> None:
    """TTFT and RSS over time, requests by kind and outcome (matplotlib's Agg canvas)."""
    fig = Figure(figsize=(10, 10), dpi=110)
    ttft_ax, rss_ax, bar_ax = fig.subplots(3, 1)
    streams = [r for r in data.results if r.kind == "stream_chat" and r.ttft_s is not None]
    ttft_ax.scatter([r.start_s for r in streams], [r.ttft_s for r in streams], s=6, alpha=0.6)
    tenth = (data.planned_s - data.primed_s) / 10
    for edge in (data.primed_s, data.primed_s + tenth, data.planned_s - tenth):
        ttft_ax.axvline(edge, color="grey", linestyle=":")
    ttft_ax.set(xlabel="s into the run", ylabel="TTFT (s)", title="streamed chat: time to first token")
    rss = [(s.t_s, s.rss_bytes / MIB) for s in data.samples if s.rss_bytes is not None]
    if rss:
        rss_ax.plot([t for t, _ in rss], [v for _, v in rss], color="tab:red", label="RSS")
    rss_ax.axvline(data.warmup_s, color="grey", linestyle=":")
    rss_ax.set(xlabel="s into the run", ylabel="server RSS (MiB)", title="resident memory and busy slots")
    busy_ax = rss_ax.twinx()
    busy = [(s.t_s, s.slots_busy) for s in data.samples if s.slots_busy is not None]
    busy_ax.step([t for t, _ in busy], [b for _, b in busy], where="post", color="tab:blue", alpha=0.4)
    busy_ax.set_ylabel("slots busy")
    _outcome_bars(bar_ax, summary)
    fig.tight_layout()
    fig.savefig(path)


def _outcome_bars(ax: Any, summary: dict[str, Any]) -> None:
    kinds = list(summary["by_kind"])
    bottom = [0] * len(kinds)
    for outcome in OUTCOMES:
        counts = [summary["by_kind"][k].get(outcome, 0) for k in kinds]
        if any(counts):
            ax.bar(kinds, counts, bottom=bottom, label=outcome)
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
    ax.set(ylabel="requests", title="requests by kind and outcome")
    ax.tick_params(axis="x", labelrotation=30)
    ax.legend(fontsize=8, ncol=3)
