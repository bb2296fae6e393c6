"""`--fail-on` thresholds for CI gating, e.g. "error_rate>0,ttft_p90>2s,output_tok_s<50".

A threshold is METRIC OP VALUE[UNIT]: METRIC is error_rate (a fraction, or VALUE%), errors,
output_tok_s, total_tok_s, requests_per_s, or ttft|itl|tpot|e2e _ mean|p50|p90|p95|p99 (seconds,
or VALUEms); OP is > >= < <=. Every run (server x level) is checked; a latency with no successful
request to measure counts as crossed, so a gate never passes on missing data.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from outpost.bench.config import BenchUsageError
from outpost.bench.records import RunSummary

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_LATENCIES = ("ttft", "itl", "tpot", "e2e")
_STATS = ("mean", "p50", "p90", "p95", "p99")
_PLAIN = ("error_rate", "errors", "output_tok_s", "total_tok_s", "requests_per_s")
METRICS = (*_PLAIN, *(f"{m}_{s}" for m in _LATENCIES for s in _STATS))
_PATTERN = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|>|<)\s*([0-9.eE+-]+)\s*(ms|s|%)?\s*$")


@dataclass(frozen=True)
class Threshold:
    metric: str
    op: str
    value: float
    text: str

    def crossed(self, observed: float | None) -> bool:
        """Missing data (None) counts as crossed."""
        return observed is None or _OPS[self.op](observed, self.value)


@dataclass(frozen=True)
class Violation:
    threshold: str
    label: str
    url: str
    level: float
    observed: float | None


def observe(metric: str, summary: RunSummary) -> float | None:
    if metric == "error_rate":
        return summary.error_rate
    if metric in _PLAIN:
        return float(getattr(summary, metric))
    name, stat = metric.rsplit("_", 1)
    value: float | None = getattr(getattr(summary, f"{name}_s"), stat)
    return value


def parse_fail_on(text: str) -> list[Threshold]:
    return [_parse_one(part) for part in text.split(",") if part.strip()]


def _parse_one(part: str) -> Threshold:
    match = _PATTERN.match(part)
    if not match:
        raise BenchUsageError(f"--fail-on: cannot read {part.strip()!r}; write e.g. ttft_p90>2s")
    metric, op, raw, unit = match.groups()
    if metric not in METRICS:
        raise BenchUsageError(f"--fail-on: unknown metric {metric!r}; one of: {', '.join(METRICS)}")
    try:
        value = float(raw)
    except ValueError:
        raise BenchUsageError(f"--fail-on: {raw!r} is not a number in {part.strip()!r}") from None
    is_time = metric.split("_")[0] in _LATENCIES
    if (unit in ("ms", "s") and not is_time) or (unit == "%" and metric != "error_rate"):
        raise BenchUsageError(f"--fail-on: unit {unit!r} does not fit {metric} in {part.strip()!r}")
    value = value / 1000 if unit == "ms" else value / 100 if unit == "%" else value
    return Threshold(metric, op, value, part.strip())


def check(thresholds: Sequence[Threshold], runs: Sequence[RunSummary]) -> list[Violation]:
    return [
        Violation(t.text, run.label, run.url, run.level, observed)
        for run in runs
        for t in thresholds
        if t.crossed(observed := observe(t.metric, run))
    ]
