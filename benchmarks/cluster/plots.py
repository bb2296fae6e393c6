"""benchmarks/cluster/'s PNGs (matplotlib, Agg: no display), each from a scenario's result dict:

- a_ttft.png: TTFT distributions (empirical CDFs), `outpost serve` vs the gateway (and the control,
  a second serve), one panel per level;
- c_prefix.png: TTFT p50/p90 and hit rate, routing on vs off, shared prefix and distinct prompts;
- d_chaos.png: tokens/s received and streams in flight over time, each kill and until its
  replacement was live, and the longest gap of every resumed stream;
- f_gateway.png: requests/s and latency against users; open streams against their longest gap,
  with the gateway's CPU.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
from matplotlib.axes import Axes
from matplotlib.figure import Figure

DPI = 110


def _nan(v: float | None) -> float:
    return float("nan") if v is None else float(v)


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    return path


def _ecdf(ax: Axes, values: list[float], label: str, color: str) -> None:
    xs = sorted(values)
    if xs:
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=label, color=color)


def plot_a(r: dict[str, Any], out: Path) -> Path:
    samples = r["samples_ttft_ms"]
    fig = Figure(figsize=(5 * len(samples), 4))
    for i, (level, s) in enumerate(sorted(samples.items(), key=lambda kv: int(kv[0]))):
        ax = fig.add_subplot(1, len(samples), i + 1)
        _ecdf(ax, s["serve"], "outpost serve", "C0")
        _ecdf(ax, s["gateway"], "gateway + RabbitMQ + worker", "C1")
        if "serve B" in s:  # the control arm: a second, identical serve
            _ecdf(ax, s["serve B"], "outpost serve (control: a second one)", "C2")
        ax.set_title(f"{level} stream(s)")
        ax.set_xlabel("time to first token (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    return _save(fig, out / "a_ttft.png")


def plot_c(r: dict[str, Any], out: Path) -> Path:
    fig = Figure(figsize=(11, 4))
    ttft, hit = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    labels, p50, p90, hits = [], [], [], []
    for name in ("shared", "distinct"):
        for routing in ("on", "off"):
            x = (r.get(name) or {}).get(routing)
            if x:
                labels.append(f"{name}\nrouting {routing}")
                p50.append(_nan(x["ttft_ms"]["p50"]))
                p90.append(_nan(x["ttft_ms"]["p90"]))
                hits.append(100 * _nan(x["hit_rate"]))
    xs = list(range(len(labels)))
    colors = ["C0" if "on" in lab else "C1" for lab in labels]
    ttft.bar(xs, p50, color=colors, label="p50")
    ttft.scatter(xs, p90, marker="_", s=400, color="k", label="p90")
    ttft.set_xticks(xs, labels)
    ttft.set_ylabel("time to first token (ms)")
    ttft.set_title("TTFT, routing on vs off")
    ttft.legend(fontsize="small")
    hit.bar(xs, hits, color=colors)
    hit.axhline(90, color="k", linestyle=":", linewidth=1)
    hit.set_xticks(xs, labels)
    hit.set_ylim(0, 100)
    hit.set_ylabel("cache_n / prompt tokens (%)")
    hit.set_title("prefix cache hit rate")
    for ax in (ttft, hit):
        ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, out / "c_prefix.png")


def _kills(ax: Axes, kills: list[dict[str, Any]], legend: bool) -> None:
    for i, k in enumerate(kills):
        first = legend and i == 0
        ax.axvline(k["t_s"], color="C3", linewidth=1, label="SIGKILL" if first else None)
        if k.get("live_after_s") is not None:
            span = (k["t_s"], k["t_s"] + k["live_after_s"])
            ax.axvspan(*span, color="C3", alpha=0.1, label="until the replacement is live" if first else None)


def plot_d(r: dict[str, Any], out: Path) -> Path:
    fig = Figure(figsize=(11, 7))
    rate, flight = fig.add_subplot(2, 1, 1), fig.add_subplot(2, 1, 2, sharex=None)
    rate.plot(r["token_rate"]["t_s"], r["token_rate"]["tokens_per_s"], color="C0", label="tokens/s received")
    _kills(rate, r["kills"], True)
    rate.set_ylabel("tokens/s (all streams)")
    rate.set_ylim(bottom=0)
    rate.legend(fontsize="small", loc="lower left")
    rate.set_title(f"chaos: {r['requests']} streams, {len(r['kills'])} kills, {r['resumes_gateway']} resumes")
    flight.plot(r["timeline"]["t_s"], r["timeline"]["in_flight"], color="C0", label="streams in flight")
    _kills(flight, r["kills"], False)
    flight.set_xlabel("seconds")
    flight.set_ylabel("streams in flight")
    flight.set_ylim(bottom=0)
    gaps = flight.twinx()
    points = r.get("resumed_points") or []
    label = "resumed stream (at its end): longest gap"
    gaps.scatter([p[0] for p in points], [_nan(p[1]) for p in points], s=14, color="C1", label=label)
    gaps.set_ylabel("longest gap between tokens (ms)")
    gaps.set_ylim(bottom=0)
    h1, l1 = flight.get_legend_handles_labels()
    h2, l2 = gaps.get_legend_handles_labels()
    flight.legend(h1 + h2, l1 + l2, fontsize="small", loc="lower left")
    for ax in (rate, flight):
        ax.grid(True, alpha=0.3)
    return _save(fig, out / "d_chaos.png")


def plot_f(r: dict[str, Any], out: Path) -> Path:
    fig = Figure(figsize=(11, 4.5))
    rate, streams = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    users = [x["users"] for x in r["rate"]]
    rate.plot(users, [x["requests_per_s"] for x in r["rate"]], marker="o", color="C0", label="requests/s")
    rate.set_xscale("log", base=2)
    rate.set_xlabel("closed-loop users")
    rate.set_ylabel("requests/s", color="C0")
    lat = rate.twinx()
    lat.plot(users, [_nan(x["latency_ms"]["p50"]) for x in r["rate"]], marker=".", color="C1", label="p50")
    lat.plot(
        users,
        [_nan(x["latency_ms"]["p99"]) for x in r["rate"]],
        marker=".",
        linestyle="--",
        color="C1",
        label="p99",
    )
    lat.set_ylabel("latency (ms)", color="C1")
    lat.legend(fontsize="small", loc="upper left")
    rate.set_title("non-streamed requests")
    n = [x["streams"] for x in r["streams"]]
    streams.plot(
        n,
        [_nan(x["max_gap_ms"]["p99"]) for x in r["streams"]],
        marker="o",
        color="C1",
        label="longest gap p99",
    )
    streams.set_xlabel("concurrent streams")
    streams.set_ylabel("longest gap between tokens, p99 (ms)", color="C1")
    cpu = streams.twinx()
    cpu.plot(
        n, [x["cpu_pct"]["gateway"] for x in r["streams"]], marker=".", color="C2", label="gateway CPU %"
    )
    cpu.set_ylabel("gateway CPU (% of a core)", color="C2")
    streams.set_title("slow streams held open")
    for ax in (rate, streams):
        ax.grid(True, alpha=0.3)
    return _save(fig, out / "f_gateway.png")


PLOTS: dict[str, Callable[[dict[str, Any], Path], Path]] = {
    "a": plot_a,
    "c": plot_c,
    "d": plot_d,
    "f": plot_f,
}


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """Every plot whose scenario ran and succeeded."""
    paths = []
    for name, plot in PLOTS.items():
        r = results.get(name)
        if isinstance(r, dict) and "error" not in r:
            try:
                paths.append(plot(r, out))
            except (KeyError, TypeError, ValueError) as exc:  # a plot must not lose the run's numbers
                print(f"plot ({name}) failed: {exc!r}", file=sys.stderr)
    return paths
