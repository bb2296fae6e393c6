"""Statistics over a run's request records: percentiles (linear interpolation, as numpy's default),
aggregate throughput, errors by code. Pure functions, no I/O."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from outpost.bench.config import Mode
from outpost.bench.records import RequestRecord, RunSummary, Stats


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolating between the closest ranks."""
    if not ordered:
        raise ValueError("percentile of no values")
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stats(values: Sequence[float | None]) -> Stats:
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return Stats(None, None, None, None, None)
    return Stats(
        mean=sum(ordered) / len(ordered),
        p50=percentile(ordered, 50),
        p90=percentile(ordered, 90),
        p95=percentile(ordered, 95),
        p99=percentile(ordered, 99),
    )


def errors_by_code(records: Sequence[RequestRecord]) -> dict[str, int]:
    return dict(sorted(Counter(r.error for r in records if r.error is not None).items()))


def run_duration(records: Sequence[RequestRecord]) -> float:
    """From the level's start to the last request's end: the wall time the throughput is over."""
    ends = [r.start_s + (r.e2e_s or 0.0) for r in records]
    return max(ends, default=0.0)


def summarise(
    records: Sequence[RequestRecord],
    *,
    label: str,
    url: str,
    model: str,
    mode: Mode,
    level: float,
    capped: bool,
) -> RunSummary:
    ok = [r for r in records if r.ok]
    duration = run_duration(records)
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum((r.prompt_tokens if r.prompt_tokens is not None else r.input_tokens) for r in ok)
    per_s = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    return RunSummary(
        label=label,
        url=url,
        model=model,
        mode=mode,
        level=level,
        requests_ok=len(ok),
        errors=len(records) - len(ok),
        errors_by_code=errors_by_code(records),
        duration_s=duration,
        output_tok_s=per_s(out_tokens),
        total_tok_s=per_s(out_tokens + in_tokens),
        requests_per_s=per_s(len(ok)),
        ttft_s=stats([r.ttft_s for r in ok]),
        itl_s=stats([r.itl_s for r in ok]),
        tpot_s=stats([r.tpot_s for r in ok]),
        e2e_s=stats([r.e2e_s for r in ok]),
        request_output_tok_s=stats([r.output_tok_s for r in ok]),
        input_tokens_mean=sum(r.input_tokens for r in ok) / len(ok) if ok else None,
        output_tokens_mean=out_tokens / len(ok) if ok else None,
        capped=capped,
        draft_n=_total([r.draft_n for r in ok]),
        draft_n_accepted=_total([r.draft_n_accepted for r in ok]),
    )


def _total(counts: list[int | None]) -> int | None:
    """The sum of the counts servers sent (None when none did)."""
    known = [c for c in counts if c is not None]
    return sum(known) if known else None
