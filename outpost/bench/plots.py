"""PNG plots of a `BenchResult` (matplotlib, Agg: no display, no pyplot global state).

- throughput.png: aggregate output tokens/s against concurrency or request rate, one line per server;
- ttft.png: p50 (solid) and p90 (dashed) time to first token against the same axis;
- latency.png: distributions (empirical CDFs) of TTFT, inter-token latency and end-to-end latency,
  one line per server and level.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from outpost.bench.records import BenchResult, RequestRecord, RunSummary

DPI = 110


def _x_label(mode: str) -> str:
    if mode == "concurrency":
        return "concurrent requests (closed loop)"
    return "request rate (requests/s, Poisson arrivals)"


def _nan(v: float | None) -> float:
    """A missing value (no successful request) as NaN: matplotlib leaves a gap there."""
    return float("nan") if v is None else v


def _by_server(result: BenchResult) -> dict[str, list[RunSummary]]:
    out: dict[str, list[RunSummary]] = {s.label: [] for s in result.servers}
    for run in result.runs:
        out[run.summary.label].append(run.summary)
    return out


def _level_axes(ax: Axes, result: BenchResult, ylabel: str, title: str) -> None:
    mode = result.runs[0].summary.mode
    levels = sorted({r.summary.level for r in result.runs})
    ax.set_xlabel(_x_label(mode))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(levels, [f"{v:g}" for v in levels])
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="server", fontsize="small")


def throughput_figure(result: BenchResult) -> Figure:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for label, runs in _by_server(result).items():
        ax.plot([r.level for r in runs], [r.output_tok_s for r in runs], marker="o", label=label)
    _level_axes(ax, result, "output tokens/s (all requests)", "Output throughput")
    return fig


def ttft_figure(result: BenchResult) -> Figure:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for i, (label, runs) in enumerate(_by_server(result).items()):
        color = f"C{i}"
        levels = [r.level for r in runs]
        ax.plot(levels, [_nan(r.ttft_s.p50) for r in runs], marker="o", color=color, label=f"{label} p50")
        ax.plot(
            levels, [_nan(r.ttft_s.p90) for r in runs], marker="s", ls="--", color=color, label=f"{label} p90"
        )
    _level_axes(ax, result, "time to first token (s)", "Time to first token, p50 and p90")
    return fig


def _cdf(ax: Axes, values: Sequence[float], label: str, color: str, style: str) -> None:
    ordered = sorted(values)
    if ordered:  # starts at 0 at the fastest request, reaches 1 at the slowest
        fractions = [0.0, *((i + 1) / len(ordered) for i in range(len(ordered)))]
        ax.step([ordered[0], *ordered], fractions, where="post", color=color, ls=style, label=label)


def _unit(values: Sequence[float]) -> tuple[float, str]:
    """Milliseconds when every value is under a second (tick labels stay short), else seconds."""
    return (1000.0, "ms") if values and max(values) < 1.0 else (1.0, "s")


def latency_figure(result: BenchResult) -> Figure:
    metrics = (
        ("ttft_s", "time to first token"),
        ("itl_s", "inter-token latency"),
        ("e2e_s", "end-to-end latency"),
    )
    fig = Figure(figsize=(13, 4.2))
    axes = fig.subplots(1, 3)
    servers = [s.label for s in result.servers]
    levels = sorted({r.summary.level for r in result.runs})
    styles = ["-", "--", ":", "-."]
    for ax, (attr, name) in zip(axes, metrics, strict=True):
        per_run = [(run.summary, _values(run.records, attr)) for run in result.runs]
        scale, unit = _unit([v for _, values in per_run for v in values])
        for s, values in per_run:
            color = f"C{servers.index(s.label)}"
            style = styles[levels.index(s.level) % len(styles)]
            _cdf(ax, [v * scale for v in values], f"{s.label} @ {s.level:g}", color, style)
        ax.set_xlabel(f"{name} ({unit})")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
    level_unit = "concurrency" if result.runs[0].summary.mode == "concurrency" else "req/s"
    axes[-1].legend(
        title=f"server @ {level_unit}", fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0)
    )
    fig.suptitle("Latency distributions (successful requests)")
    return fig


def _values(records: Sequence[RequestRecord], attr: str) -> list[float]:
    return [v for v in (getattr(r, attr) for r in records if r.ok) if v is not None]


def write_plots(result: BenchResult, out: Path) -> list[Path]:
    """Every plot into `out`; nothing when there are no runs."""
    if not result.runs:
        return []
    figures = {"throughput.png": throughput_figure, "ttft.png": ttft_figure, "latency.png": latency_figure}
    paths = []
    for name, make in figures.items():
        make(result).savefig(out / name, dpi=DPI, bbox_inches="tight")
        paths.append(out / name)
    return paths
