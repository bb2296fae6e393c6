"""Where an Outpost server's decoding steps spend their time: a summary of its step profile.

Run a server (or `python -m benchmarks.serve`) with OUTPOST_STEP_PROFILE=FILE
(outpost/serving/step_profile.py), then `python -m benchmarks.serve.steps FILE [--plot PNG]`.
Steps are grouped by how many sequences they decode and whether they also read prompt tokens.
The table gives each group's mean runs of consecutive seq ids (with a KV stream per slot llama.cpp
decodes each run as its own micro-batch; 1 where a profile predates the field), and each group's
mean milliseconds per part, which add up to its mean step (a step's ITL share: from the end of the
step before to its end), beside its median. The threads' CPU seconds show how much the HTTP / SSE
side (the main thread's event loop) takes beside the engine thread and llama.cpp's workers.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.figures import pyplot, save

PARTS = ("wait", "schedule", "llama_decode", "runner", "update", "emit")
# A wait this long is an idle engine (no request), not time a step lost.
IDLE_WAIT_MS = 1000.0


@dataclass
class Group:
    """Steps of one width: their parts' milliseconds, one list per part."""

    parts: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    totals: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)

    def add(self, step: dict[str, float]) -> None:
        for part in PARTS:
            self.parts[part].append(step[part])
        self.totals.append(sum(step[p] for p in PARTS))
        self.prompt_tokens.append(int(step["prompt"]))
        self.runs.append(int(step.get("runs", 1)))


@dataclass
class Profile:
    groups: dict[tuple[int, bool], Group]  # (sequences decoding, reads prompt tokens) -> steps
    cpu: dict[str, float]  # role -> CPU seconds from the first record to the last
    wall_s: float


def read_profile(lines: Iterable[str], widths: set[int] | None = None) -> Profile:
    """The steps (of `widths` only, if given) and the CPU seconds between the first CPU record
    and the last (of every process in the file, summed)."""
    groups: dict[tuple[int, bool], Group] = defaultdict(Group)
    first: dict[int, dict[str, float]] = {}
    last: dict[int, tuple[float, dict[str, float]]] = {}
    starts: dict[int, float] = {}
    pid = 0
    for line in lines:
        record = json.loads(line)
        if "pid" in record:
            pid = record["pid"]
        elif "cpu" in record:
            first.setdefault(pid, record["cpu"])
            starts.setdefault(pid, record["t"])
            last[pid] = (record["t"], record["cpu"])
        elif record["wait"] < IDLE_WAIT_MS and (widths is None or record["decode"] in widths):
            groups[(record["decode"], record["prompt"] > 0)].add(record)
    cpu: dict[str, float] = defaultdict(float)
    wall = 0.0
    for p, (t, seconds) in last.items():
        wall += t - starts[p]
        for role, value in seconds.items():
            cpu[role] += value - first[p].get(role, 0.0)
    return Profile(dict(groups), dict(cpu), wall)


def table(profile: Profile) -> str:
    """A markdown table: a row per (width, with prompt), mean ms per part, mean and p50 step."""
    head = "| decoding | prompt tokens | steps | runs | " + " | ".join(PARTS) + " | step mean | step p50 |"
    rows = [head, "|" + "---:|" * (len(PARTS) + 6)]
    for (width, with_prompt), g in sorted(profile.groups.items()):
        tokens = f"{statistics.mean(g.prompt_tokens):.0f} (mean)" if with_prompt else "0"
        means = " | ".join(f"{statistics.mean(g.parts[p]):.2f}" for p in PARTS)
        total = f"{statistics.mean(g.totals):.2f} | {statistics.median(g.totals):.2f}"
        runs = f"{statistics.mean(g.runs):.2f}"
        rows.append(f"| {width} | {tokens} | {len(g.totals)} | {runs} | {means} | {total} |")
    return "\n".join(rows)


def cpu_line(profile: Profile) -> str:
    if not profile.cpu or profile.wall_s <= 0:
        return "threads' CPU: no CPU records"
    used = sum(profile.cpu.values())
    shares = ", ".join(f"{role} {s:.1f} s ({s / used:.0%})" for role, s in sorted(profile.cpu.items()))
    return f"threads' CPU over {profile.wall_s:.1f} s of wall time: {shares}"


def plot(profile: Profile, path: Path) -> None:
    """Stacked bars: each group's mean ms per part."""
    plt = pyplot()

    keys = sorted(profile.groups)
    labels = [f"{w}{' +prompt' if p else ''}" for w, p in keys]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(keys) + 2), 4))
    bottom = [0.0] * len(keys)
    for part in PARTS:
        heights = [statistics.mean(profile.groups[k].parts[part]) for k in keys]
        ax.bar(labels, heights, bottom=bottom, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_xlabel("sequences decoding in the step (+prompt: it also reads prompt tokens)")
    ax.set_ylabel("mean ms per step")
    ax.set_title("Where a decoding step's time goes")
    ax.tick_params(axis="x", rotation=60)
    ax.legend(fontsize=8)
    save(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("profile", type=Path, help="the OUTPOST_STEP_PROFILE file")
    p.add_argument("--widths", help="only steps decoding this many sequences (e.g. 14,15,16)")
    p.add_argument("--plot", type=Path, help="write the stacked-bar plot here (PNG)")
    args = p.parse_args()
    widths = {int(w) for w in args.widths.split(",")} if args.widths else None
    with args.profile.open(encoding="utf-8") as lines:
        profile = read_profile(lines, widths)
    print(table(profile))
    print(cpu_line(profile))
    if args.plot is not None:
        plot(profile, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
