"""The docs table of a GPU run of scripts/gpu-bench.sh, made from its raw files and nothing else.

Not a test. Run on the folder scripts/gpu-bench.sh filled (its $OUT):
    python -m benchmarks.gpu report RESULTS_DIR > table.md
Reads env.json (the card as nvidia-smi prints it, build flags, llama.cpp's device list),
greedy.json (benchmarks/gpu/greedy.py), serve.jsonl (one benchmarks/serve/ summary per level)
and ready.txt (Outpost's ready lines), and writes markdown: the card, then per stream count both
servers' output tok/s and TTFT p50, the ratios against issue 29's targets, errors, the greedy
comparison and the ready lines. A missing file or level is said so, never filled in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OURS, BASE = "outpost", "llama-server"
# issue 29: Outpost / llama-server output tok/s at least, TTFT p50 at most, at these stream counts
TOK_S_TARGETS = {1: 1.0, 32: 1.2, 64: 1.2}
TTFT_TARGETS = {32: 0.8}


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _levels(path: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """streams -> server -> its row, from every summary line of serve.jsonl."""
    rows: dict[int, dict[str, dict[str, Any]]] = {}
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return rows
    for line in lines:
        try:
            summary = json.loads(line)
        except ValueError:
            continue
        for row in summary.get("throughput", []):
            rows.setdefault(int(row["streams"]), {})[row["server"]] = row
    return rows


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _verdict(ratio: float | None, target: float | None, at_least: bool) -> str:
    if target is None:
        return ""
    if ratio is None:
        return f"target {'>=' if at_least else '<='} {target} (no figure)"
    met = ratio >= target if at_least else ratio <= target
    return f"{'met' if met else 'MISSED'} ({'>=' if at_least else '<='} {target})"


def serve_table(levels: dict[int, dict[str, dict[str, Any]]]) -> list[str]:
    out = [
        "| streams | Outpost tok/s | llama-server tok/s | ratio | tok/s target | Outpost TTFT p50 (s) "
        "| llama-server TTFT p50 (s) | ratio | TTFT target | errors (Outpost / llama-server) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for streams in sorted(levels):
        ours, base = levels[streams].get(OURS, {}), levels[streams].get(BASE, {})
        tok = _ratio(ours.get("output_tok_s"), base.get("output_tok_s"))
        ttft = _ratio(ours.get("ttft_p50_s"), base.get("ttft_p50_s"))
        errors = f"{ours.get('errors', '-')} / {base.get('errors', '-')}"
        out.append(
            f"| {streams} | {_num(ours.get('output_tok_s'))} | {_num(base.get('output_tok_s'))} | "
            f"{_num(tok, 2)} | {_verdict(tok, TOK_S_TARGETS.get(streams), True)} | "
            f"{_num(ours.get('ttft_p50_s'), 3)} | {_num(base.get('ttft_p50_s'), 3)} | {_num(ttft, 2)} | "
            f"{_verdict(ttft, TTFT_TARGETS.get(streams), False)} | {errors} |"
        )
    return out


def greedy_lines(greedy: dict[str, Any] | None) -> list[str]:
    if not greedy:
        return ["Greedy comparison: no greedy.json (the step did not finish)."]
    s = greedy["summary"]
    gaps = ", ".join(f"{g:.4f}" for g in s.get("top2_gaps_at_partings", [])) or "none"
    return [
        f"Greedy token ids, Outpost vs llama-server, -ngl {greedy['args'].get('ngl')}, one request at a "
        f"time, {greedy['args'].get('tokens')} tokens per prompt: {s['identical_sequences']} of "
        f"{s['prompts']} sequences identical; {100 * s['share_tokens_before_parting']:.1f}% of all tokens "
        f"come before the first difference of their sequence; {s['partings']} partings, top-2 logprob "
        f"gaps there (each side's): {gaps}.",
    ]


def report(folder: Path) -> str:
    env = _load(folder / "env.json") or {}
    devices = ", ".join(
        f"{d['name']} ({d['kind']}, {d['description']}, "
        f"{d['free'] / 2**30:.1f} of {d['total'] / 2**30:.1f} GiB free)"
        for d in env.get("devices", [])
    )
    lines = [
        f"Card (nvidia-smi): {env.get('card', 'not read')}; nvcc: {env.get('nvcc', '-')}; "
        f"{env.get('cpus', '?')} CPUs; Python {env.get('python', '?')}.",
        f"llama.cpp build: {env.get('cmake_flags', '?')} ({env.get('build_seconds', '?')} s); "
        f"devices llama.cpp lists: {devices or 'not read'}.",
        f"Model: {env.get('model', '?')} (random weights).",
        "",
        *serve_table(_levels(folder / "serve.jsonl")),
        "",
        *greedy_lines(_load(folder / "greedy.json")),
        "",
        "Outpost's ready lines (ready.txt):",
        "",
        "```",
        _text(folder / "ready.txt").rstrip() or "(none)",
        "```",
    ]
    return "\n".join(lines) + "\n"
