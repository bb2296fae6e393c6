"""Medians over the rounds, the issue's targets as ratios, identical-text shares and the plots."""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness.figures import pyplot, save
from benchmarks.spec.arms import Arm
from benchmarks.spec.measure import PassResult
from benchmarks.spec.tasks import Task, copy_share


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _acceptance(passes: list[PassResult]) -> float | None:
    drafted = sum(r.draft_n for p in passes for r in p.replies)
    accepted = sum(r.draft_n_accepted for p in passes for r in p.replies)
    return accepted / drafted if drafted else None


def _identical(mine: list[PassResult], plain: list[PassResult]) -> float | None:
    pairs = [
        (a.text, b.text)
        for p, q in zip(mine, plain, strict=False)
        for a, b in zip(p.replies, q.replies, strict=False)
        if a.error is None and b.error is None
    ]
    return sum(a == b for a, b in pairs) / len(pairs) if pairs else None


def report(
    results: dict[str, dict[int, list[PassResult]]],
    arms: list[Arm],
    tasks: list[Task],
    argv: dict[str, list[str]],
    out: Path,
) -> dict[str, Any]:
    copy = {t.name for t in tasks if t.copy}
    chat = {t.name for t in tasks if not t.copy}
    table: dict[str, dict[str, Any]] = {}
    for arm in arms:
        rows: dict[str, Any] = {}
        for n, passes in results[arm.label].items():
            rows[f"{n}"] = {
                "decode_tok_s": _median([p.decode_tok_s() for p in passes]),
                "acceptance": _acceptance(passes),
                "errors": sum(p.errors for p in passes),
            }
            if n > 1:
                rows[f"{n}"]["pass_tok_s"] = _median([p.pass_tok_s() for p in passes])
            if n == 1:
                rows["1"]["ttft_s"] = _median([p.ttft_s() for p in passes])
                rows["1"]["e2e_tok_s"] = _median([p.e2e_tok_s() for p in passes])
                rows["1-copy"] = {"decode_tok_s": _median([p.decode_tok_s(copy) for p in passes])}
                rows["1-chat"] = {"decode_tok_s": _median([p.decode_tok_s(chat) for p in passes])}
                plain = _plain(arm, arms)
                if plain is not None and plain is not arm:
                    rows["identical_1_stream"] = _identical(passes, results[plain.label][1])
        table[arm.label] = rows
    targets = _targets(table, arms)
    _plot(table, arms, out)
    return {
        "cpu": _cpu(),
        "commands": {label: " ".join(cmd) for label, cmd in argv.items()},
        "tasks": [{"name": t.name, "copy": t.copy} for t in tasks],
        "copy_share": _copy_shares(results, arms, tasks),
        "arms": table,
        "targets": targets,
    }


def _copy_shares(
    results: dict[str, dict[int, list[PassResult]]], arms: list[Arm], tasks: list[Task]
) -> dict[str, dict[str, float]]:
    """Each plain arm's 1-stream answers, per task: the median share of words prompt lookup predicts
    (tasks.copy_share), which says whether a "copy-heavy" task was copied by this model."""
    prompts = {t.name: t.prompt for t in tasks}
    shares: dict[str, dict[str, float]] = {}
    for arm in arms:
        if arm.spec != "none" or 1 not in results.get(arm.label, {}):
            continue
        replies = [r for p in results[arm.label][1] for r in p.replies if r.error is None and r.text]
        shares[arm.label] = {
            name: round(statistics.median(copy_share(prompt, r.text) for r in found), 2)
            for name, prompt in prompts.items()
            if (found := [r for r in replies if r.task == name])
        }
    return shares


def _cpu() -> str:
    """The CPU model, its count here and the load average when the report is written (the run's
    own servers included), so a figure says which machine and how busy it was."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")]
    model = names[0] if names else "?"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {len(os.sched_getaffinity(0))} CPUs; load average at the end {load}"


def _plain(arm: Arm, arms: list[Arm]) -> Arm | None:
    target = arm.model
    return next((a for a in arms if a.server == arm.server and a.spec == "none" and a.model == target), None)


def _get(table: dict[str, dict[str, Any]], label: str, row: str, key: str = "decode_tok_s") -> float | None:
    value = table.get(label, {}).get(row, {}).get(key)
    return float(value) if value is not None else None


def _targets(table: dict[str, dict[str, Any]], arms: list[Arm]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def check(name: str, a: float | None, b: float | None, goal: float) -> None:
        r = _ratio(a, b)
        found.append({"target": name, "ratio": r, "goal": goal, "met": r is not None and r >= goal})

    by = {(a.server, a.spec, a.draft is not None or a.model.name.endswith("f16.gguf")): a.label for a in arms}
    ours_plain, theirs = by.get(("outpost", "none", False)), "llama-server"
    for kind in ("ngram-simple", "ngram-mod"):
        ours = by.get(("outpost", kind, False))
        other = by.get((theirs, kind, False))
        if ours is None or ours_plain is None:
            continue
        check(
            f"1 stream copy: outpost {kind} / outpost",
            _get(table, ours, "1-copy"),
            _get(table, ours_plain, "1-copy"),
            1.2,
        )
        if other:
            check(
                f"1 stream copy: outpost {kind} / llama-server {kind}",
                _get(table, ours, "1-copy"),
                _get(table, other, "1-copy"),
                1.0,
            )
        check(
            f"1 stream chat: outpost {kind} / outpost",
            _get(table, ours, "1-chat"),
            _get(table, ours_plain, "1-chat"),
            0.97,
        )
        check(
            f"8 streams: outpost {kind} / outpost", _get(table, ours, "8"), _get(table, ours_plain, "8"), 0.97
        )
        if other:
            check(
                f"8 streams: outpost {kind} / llama-server {kind}",
                _get(table, ours, "8"),
                _get(table, other, "8"),
                1.0,
            )
            # Not one of the issue's: the same over each pass's wall time (a server that reads
            # every prompt before decoding has fast streams after a late first token).
            check(
                f"8 streams, whole passes: outpost {kind} / llama-server {kind}",
                _get(table, ours, "8", "pass_tok_s"),
                _get(table, other, "8", "pass_tok_s"),
                1.0,
            )
    draft, draft_plain = by.get(("outpost", "draft", True)), by.get(("outpost", "none", True))
    if draft and draft_plain:
        check(
            "draft model, 1 stream: outpost / outpost f16",
            _get(table, draft, "1"),
            _get(table, draft_plain, "1"),
            1.2,
        )
        other = by.get((theirs, "draft", True))
        if other:
            check(
                "draft model, 1 stream: outpost / llama-server -md",
                _get(table, draft, "1"),
                _get(table, other, "1"),
                1.0,
            )
            # Not one of the issue's: the same over whole requests (where the draft's prompt read
            # falls, before or after the first token, cannot move it).
            check(
                "draft model, 1 stream, whole requests: outpost / llama-server -md",
                _get(table, draft, "1", "e2e_tok_s"),
                _get(table, other, "1", "e2e_tok_s"),
                1.0,
            )
    errors = sum(
        row.get("errors", 0) for rows in table.values() for row in rows.values() if isinstance(row, dict)
    )
    found.append({"target": "0 errors", "errors": errors, "met": errors == 0})
    return found


def _plot(table: dict[str, dict[str, Any]], arms: list[Arm], out: Path) -> None:
    plt = pyplot()

    rows = ["1-copy", "1-chat", "4", "8"]
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5))
    labels = [a.label for a in arms]
    width = 0.8 / len(rows)
    for i, row in enumerate(rows):
        values = [_get(table, label, row) or 0.0 for label in labels]
        axes[0].bar(
            [x + i * width for x in range(len(labels))], values, width, label=row.replace("-", " stream ")
        )
    axes[0].set_xticks(
        [x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=35, ha="right", fontsize=8
    )
    axes[0].set_ylabel("decode tok/s after the first token (median of rounds)")
    axes[0].legend(title="streams")
    acc = [table[label].get("1", {}).get("acceptance") or 0.0 for label in labels]
    axes[1].bar(range(len(labels)), acc, color="tab:green")
    axes[1].set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)
    axes[1].set_ylabel("draft acceptance, 1 stream")
    axes[1].set_ylim(0, 1)
    fig.suptitle(f"Speculative decoding: SmolLM2-135M; {_cpu()}", fontsize=10)
    save(fig, out / "spec.png", dpi=110)
