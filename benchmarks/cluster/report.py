"""benchmarks/cluster/'s markdown tables (stderr, pasteable into docs/performance.md) and its one-line
JSON summary, from the scenarios' result dicts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

TITLES = {
    "a": "(a) outpost serve vs gateway + RabbitMQ + 1 worker",
    "b": "(b) 1 vs 2 workers, one core each",
    "c": "(c) prefix-aware routing on vs off (2 gateways, 2 workers)",
    "d": "(d) chaos: a worker SIGKILLed and restarted",
    "e": "(e) a burst at 2 workers x 4 slots, queue 256",
    "f": "(f) the gateway alone against fake workers",
}


def _f(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _pair(d: dict[str, Any] | None, a: str, b: str, digits: int = 1) -> str:
    d = d or {}
    return f"{_f(d.get(a), digits)} / {_f(d.get(b), digits)}"


def md(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _row_a(label: str, x: dict[str, Any]) -> list[str]:
    return [
        label,
        _pair(x["serve_ttft_ms"], "p50", "p99"),
        _pair(x["gateway_ttft_ms"], "p50", "p99"),
        _pair(x["added_ttft_ms"], "p50", "p99"),
        _f(x["serve_output_tok_s"]),
        _f(x["gateway_output_tok_s"]),
        _f(x["throughput_ratio"], 2),
    ]


def table_a(r: dict[str, Any]) -> str:
    """serve vs gateway per level, and under it the control: serve vs a second serve (its columns
    read 'serve' for the first and 'gateway' for the second)."""
    header = ["streams", "serve TTFT p50 / p99 ms", "gateway TTFT p50 / p99 ms", "added p50 / p99 ms"]
    header += ["serve tok/s", "gateway tok/s", "ratio"]
    rows = []
    for key in sorted(k for k in r if k.startswith("streams_")):
        level = key.removeprefix("streams_")
        rows.append(_row_a(level, r[key]))
        if r[key].get("control"):
            rows.append(_row_a(f"{level}, control: serve vs serve B", r[key]["control"]))
    text = md(header, rows)
    paired = r.get("paired_1_stream")
    if paired and paired.get("pairs"):
        a = paired["added_ttft_ms"]
        text += (
            f"\n\nPaired, 1 stream ({paired['pairs']} prompts, each to serve and the gateway back to back): "
            f"added TTFT per pair p50 {_f(a['p50'], 2)} ms (p10 {_f(a['p10'], 2)}, p90 {_f(a['p90'], 2)}, "
            f"p99 {_f(a['p99'], 2)}); TTFT p50 serve {_f(paired['serve_ttft_ms_p50'])} ms, gateway "
            f"{_f(paired['gateway_ttft_ms_p50'])} ms."
        )
    floor = r.get("broker_floor_ms")
    if not floor:
        return text
    request, reply = _pair(floor["request_hop"], "p50", "p99", 2), _pair(floor["reply_hop"], "p50", "p99", 2)
    note = (
        "\n\nThe broker's two hops alone (aio-pika, no Outpost code; request hop + reply hop, per message): "
        f"p50 {_f(floor['both']['p50'], 2)} ms, p99 {_f(floor['both']['p99'], 2)} ms "
        f"(request {request}, reply {reply})."
    )
    return text + note


def table_b(r: dict[str, Any]) -> str:
    rows = [
        ["1", "8", _f(r["one_worker_output_tok_s"]), _f(r["ttft_s_p50"]["one"], 2), _f(r["errors"]["one"])],
        ["2", "16", _f(r["two_workers_output_tok_s"]), _f(r["ttft_s_p50"]["two"], 2), _f(r["errors"]["two"])],
    ]
    return (
        md(["workers", "streams", "output tok/s", "TTFT p50 s", "errors"], rows)
        + f"\n\nratio: {_f(r['ratio'], 2)}x"
    )


def table_c(r: dict[str, Any]) -> str:
    header = ["workload", "routing", "hit rate", "TTFT p50 / p90 ms", "output tok/s", "total tok/s", "req/s"]
    header += ["routed prefix / placed / shared / lane full", "per worker: done (blocks held)", "errors"]
    rows = []
    for name in ("shared", "distinct"):
        for routing in ("on", "off"):
            x = (r.get(name) or {}).get(routing)
            if not x:
                continue
            g = x["routing"]
            routed = f"{g['routed_prefix']} / {g['routed_placed']} / {g['routed_shared']} / {g['lane_full']}"
            hit = "-" if x["hit_rate"] is None else f"{100 * x['hit_rate']:.1f}%"
            ttft = _pair(x["ttft_ms"], "p50", "p90", 0)
            tput = [_f(x["output_tok_s"]), _f(x["total_tok_s"]), _f(x["requests_per_s"], 2)]
            workers = " / ".join(f"{w['requests_done']} ({w['prefix_blocks']})" for w in x.get("workers", []))
            rows.append([name, routing, hit, ttft, *tput, routed, workers, _f(x["errors"])])
    notes = f"\n\nTTFT p50 on/off: {_f(r.get('ttft_p50_ratio'), 2)}; no shared prefix, total tok/s on/off: "
    return md(header, rows) + notes + _f(r.get("distinct_throughput_ratio"), 3)


def table_d(r: dict[str, Any]) -> str:
    header = [
        "requests",
        "success %",
        "without final outcome",
        "duplicated / missing tokens",
        "resumes (gateway)",
    ]
    header += ["resumed streams seen", "longest gap, resumed p50 / p99 ms", "others p50 / p99 ms", "kills"]
    row = [
        _f(r["requests"]),
        _f(r["success_pct"], 2),
        _f(r["without_final_outcome"]),
        f"{r['duplicated_tokens']} / {r['missing_tokens']}",
        _f(r["resumes_gateway"]),
        _f(r["resumed_streams_seen"]),
        _pair(r["max_gap_resumed"], "p50_ms", "p99_ms", 0),
        _pair(r["max_gap_others"], "p50_ms", "p99_ms", 0),
        _f(len(r["kills"])),
    ]
    extra = f"\n\nfaults: {r['faults'] or 'none'}; errors: {r['errors_by_code'] or 'none'}"
    return md(header, [row]) + extra


def table_e(r: dict[str, Any]) -> str:
    ttft = r.get("ttft_s") or {}
    row = [_f(r["requests"]), _f(r["answered_ok"]), _f(r["rejected"]), _f(r["errors"]), _f(r["duration_s"])]
    row.append(f"{_f(ttft.get('p50'), 2)} / {_f(ttft.get('p99'), 2)}")
    return md(["requests", "answered", "rejected", "errors", "seconds", "TTFT p50 / p99 s"], [row])


def _cpu(c: dict[str, float]) -> str:
    return " / ".join(_f(c.get(k), 0) for k in ("gateway", "broker", "fake_workers", "load_generator"))


def _stream_row(x: dict[str, Any]) -> list[str]:
    ttft, gap = _pair(x["ttft_ms"], "p50", "p99", 0), _pair(x["max_gap_ms"], "p50", "p99", 0)
    return [
        _f(x["streams"]),
        _f(x["complete"]),
        ttft,
        gap,
        _cpu(x["cpu_pct"]),
        "yes" if x["sustained"] else "no",
    ]


def table_f(r: dict[str, Any]) -> str:
    cpu = "CPU % gateway / broker / fakes / load"
    rate = md(
        ["users", "req/s", "latency p50 / p99 ms", "errors", cpu],
        [
            [
                _f(x["users"]),
                _f(x["requests_per_s"]),
                _pair(x["latency_ms"], "p50", "p99"),
                _f(x["errors"]),
                _cpu(x["cpu_pct"]),
            ]
            for x in r["rate"]
        ],
    )
    streams = md(
        ["streams", "complete", "TTFT p50 / p99 ms", "longest gap p50 / p99 ms", cpu, "sustained"],
        [_stream_row(x) for x in r["streams"]],
    )
    knee = r.get("rate_knee") or {}
    return (
        f"{rate}\n\nknee: {_f(knee.get('requests_per_s'))} req/s at {_f(knee.get('users'))} users "
        f"(best {_f(knee.get('best_requests_per_s'))})\n\n{streams}\n\n"
        f"streams sustained: {_f(r.get('streams_sustained'))}"
    )


TABLES: dict[str, Callable[[dict[str, Any]], str]] = {
    "a": table_a,
    "b": table_b,
    "c": table_c,
    "d": table_d,
    "e": table_e,
    "f": table_f,
}


def targets_table(results: dict[str, Any]) -> str:
    rows = []
    for name in TABLES:
        for t in (results.get(name) or {}).get("targets", []):
            met = {True: "yes", False: "NO", None: "-"}[t["met"]]
            rows.append([f"({name}) {t['name']}", _f(t["value"], 3), t["target"], met])
    return md(["target", "value", "goal", "met"], rows)


def format_all(results: dict[str, Any]) -> str:
    parts = []
    for name, table in TABLES.items():
        if isinstance(results.get(name), dict) and "error" not in results[name]:
            parts.append(f"### {TITLES[name]}\n\n{table(results[name])}")
        elif name in results:
            parts.append(f"### {TITLES[name]}\n\nfailed: {results[name].get('error')}")
    parts.append(f"### Targets\n\n{targets_table(results)}")
    return "\n\n".join(parts)


def _strip(obj: Any) -> Any:
    """The result without raw samples and timelines (for the one-line summary)."""
    if isinstance(obj, dict):
        drop = (
            "samples",
            "samples_ttft_ms",
            "timeline",
            "token_rate",
            "resumed_points",
            "kills",
            "no_outcome_detail",
        )
        return {k: _strip(v) for k, v in obj.items() if k not in drop}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def summary(results: dict[str, Any]) -> dict[str, Any]:
    return _strip(results)  # type: ignore[no-any-return]
