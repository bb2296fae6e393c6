"""benchmarks/serve/'s PNGs (matplotlib, Agg: no display):

- throughput.png: output tok/s against concurrent streams, per server: the median over rounds
  (line) and every round's value (dots), so the spread shows;
- ttft.png: p50 time to first token against streams, the same way (p90 medians dashed);
- shared_prefix.png: TTFT p50 (bars) and p90 (ticks), cold and warm, per server; and the prompt
  tokens evaluated vs reused per request;
- models.png: cold vs warm TTFT per model on one Outpost (the load alone hatched), and output tok/s
  with two models at once, one Outpost against two llama-servers (median line, each round's dots).

Run through serve.py:  python -m benchmarks.serve ...
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from benchmarks.serve.models_report import PAIR, ModelsReport, cold_rows, multi_rows
from benchmarks.serve.report import level_rows, prefix_rows

if TYPE_CHECKING:
    from benchmarks.serve.report import Report

DPI = 110
COLORS = {
    "outpost": "C0",
    "llama-server": "C1",
    "llama-cpp-python": "C2",
    PAIR: "C1",
}  # the same in every plot


def _color(server: str) -> str:
    return COLORS.get(server, "C3")


def _nan(v: float | None) -> float:
    return float("nan") if v is None else v


def _by_server(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(r["server"], []).append(r)
    return out


def _levels_axes(ax: Axes, levels: list[int], ylabel: str, title: str) -> None:
    ax.set_xlabel("concurrent streams (closed loop)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.set_xticks(levels, [str(v) for v in levels])
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(title="server", fontsize="small")


def _median_and_rounds(ax: Axes, rows: list[dict[str, Any]], metric: str, color: str, label: str) -> None:
    levels = [r["streams"] for r in rows]
    ax.plot(levels, [_nan(r[metric]) for r in rows], marker="o", color=color, label=f"{label} (median)")
    for r in rows:
        values = [v for v in r[f"{metric}_rounds"] if v is not None]
        ax.scatter([r["streams"]] * len(values), values, s=12, color=color, alpha=0.5)


def throughput_figure(rows: list[dict[str, Any]], rounds: int) -> Figure:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for server, srows in _by_server(rows).items():
        _median_and_rounds(ax, srows, "output_tok_s", _color(server), server)
    levels = sorted({r["streams"] for r in rows})
    _levels_axes(
        ax, levels, "output tokens/s (all streams)", f"Output throughput (dots: each of {rounds} rounds)"
    )
    return fig


def ttft_figure(rows: list[dict[str, Any]], rounds: int) -> Figure:
    fig = Figure(figsize=(7, 4.5))
    ax = fig.add_subplot()
    for server, srows in _by_server(rows).items():
        _median_and_rounds(ax, srows, "ttft_p50_s", _color(server), f"{server} p50")
        levels = [r["streams"] for r in srows]
        ax.plot(
            levels,
            [_nan(r["ttft_p90_s"]) for r in srows],
            ls="--",
            color=_color(server),
            label=f"{server} p90",
        )
    levels = sorted({r["streams"] for r in rows})
    _levels_axes(ax, levels, "time to first token (s)", f"TTFT (dots: each of {rounds} rounds' p50)")
    return fig


def shared_prefix_figure(rows: list[dict[str, Any]], streams: int) -> Figure:
    fig = Figure(figsize=(15, 5))
    ttft_ax, tok_ax = fig.subplots(1, 2)
    labels = [f"{r['server']}\n{r['phase'].replace(': ', chr(10))}" for r in rows]  # "cold\nfirst wave"
    xs = list(range(len(rows)))
    colors = [_color(r["server"]) for r in rows]
    ttft_ax.bar(xs, [_nan(r["ttft_p50_s"]) for r in rows], color=colors, label="p50")
    ttft_ax.scatter(xs, [_nan(r["ttft_p90_s"]) for r in rows], marker="_", s=400, color="black", label="p90")
    ttft_ax.set_ylabel("time to first token (s)")
    ttft_ax.set_title(f"Shared prefix, {streams} streams: TTFT (median of rounds)")
    evaluated = [_nan(r["prompt_n_mean"]) for r in rows]
    tok_ax.bar(xs, evaluated, color=colors, label="evaluated (timings.prompt_n)")
    tok_ax.bar(
        xs,
        [_nan(r["cache_n_mean"]) for r in rows],
        bottom=evaluated,
        color=colors,
        alpha=0.35,
        hatch="//",
        label="reused from cache (timings.cache_n)",
    )
    tok_ax.set_ylabel("prompt tokens per request (mean)")
    tok_ax.set_title("Prompt tokens evaluated vs reused")
    for ax in (ttft_ax, tok_ax):
        ax.set_xticks(xs, labels, fontsize="small")
        ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="upper right")
    return fig


def _cold_warm_axes(ax: Axes, rows: list[dict[str, Any]]) -> None:
    xs = list(range(len(rows)))
    cold, warm = [_nan(r["cold_ttft_s"]) for r in rows], [_nan(r["warm_ttft_s"]) for r in rows]
    ax.bar([x - 0.2 for x in xs], cold, width=0.4, color="C0", label="cold: first request after an unload")
    ax.bar(
        [x - 0.2 for x in xs],
        [_nan(r["load_s"]) for r in rows],
        width=0.4,
        color="none",
        edgecolor="black",
        hatch="//",
        label="of which: the load alone (timed apart)",
    )
    ax.bar([x + 0.2 for x in xs], warm, width=0.4, color="C0", alpha=0.45, label="warm: the next request")
    ax.set_xticks(xs, [r["model"] for r in rows], fontsize="small")
    ax.set_ylabel("time to first token (s), median of rounds")
    ax.set_title("One Outpost, --models-dir: cold vs warm TTFT")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")


def models_figure(models: ModelsReport, rounds: int) -> Figure:
    """models.png: the cold/warm bars (left) and the two-models throughput (right)."""
    fig = Figure(figsize=(14, 5))
    cold_ax, tok_ax = fig.subplots(1, 2)
    _cold_warm_axes(cold_ax, cold_rows(models.cold))
    rows = multi_rows(models.multi)
    for server, srows in _by_server(rows).items():
        _median_and_rounds(tok_ax, srows, "output_tok_s", _color(server), server)
    levels = sorted({r["streams"] for r in rows})
    title = f"Two models at once (dots: each of {rounds} rounds)"
    _levels_axes(tok_ax, levels, "output tokens/s (both models)", title)
    tok_ax.set_xlabel("concurrent streams in all, split over the two models")
    return fig


def write_plots(report: Report, out: Path) -> list[Path]:
    """The PNGs that have data; returns their paths."""
    figures: dict[str, Figure] = {}
    rows = level_rows(report.level_runs)
    if rows:
        figures["throughput.png"] = throughput_figure(rows, report.args.rounds)
        figures["ttft.png"] = ttft_figure(rows, report.args.rounds)
    prefix = prefix_rows(report.prefix_runs)
    if prefix:
        figures["shared_prefix.png"] = shared_prefix_figure(prefix, report.args.prefix_streams)
    models = report.models
    if isinstance(models, ModelsReport) and (models.cold or models.multi):
        figures["models.png"] = models_figure(models, report.args.rounds)
    for name, fig in figures.items():
        fig.savefig(out / name, dpi=DPI, bbox_inches="tight")
    return [out / name for name in figures]
