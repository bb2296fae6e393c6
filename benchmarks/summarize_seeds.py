"""How often `outpost run --preset summarize` ends a summary by itself, over many seeds.

One model load, then the preset as `outpost run` builds it (its flags parsed by the real parser) for
each seed in turn; any other `run` flag given after `--` overrides the preset as on the command line:

    python -m benchmarks.summarize_seeds -m SmolLM2.gguf --seeds 1-24 -- --repeat-penalty 1.0

Prints one line per seed (tokens generated, why it ended, whether the text names the document's
subject) and the share that ended by themselves before the token limit; `--no-guard` runs the preset
without its repeat guard, as it was before it had one.
"""

from __future__ import annotations

import argparse
import io
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from outpost.cli import build_parser
from outpost.messages import FinishReason
from outpost.run import _engine_config, new_session, run_settings

DOCUMENT = Path(__file__).parent.parent / "tests" / "data" / "lighthouse-report.txt"
SUBJECT_WORDS = ("lighthouse", "tower", "panel", "inspection")  # any one names the report's subject


@dataclass(frozen=True)
class Summary:
    seed: int
    n_generated: int
    finish: FinishReason | None
    looped: bool  # stopped by the preset's repeat guard
    text: str

    @property
    def ended_by_itself(self) -> bool:
        return self.finish is FinishReason.STOP

    @property
    def names_subject(self) -> bool:
        return any(word in self.text.lower() for word in SUBJECT_WORDS)


def summarize(
    model: str, seeds: list[int], run_flags: list[str], guard: bool = True, document: Path = DOCUMENT
) -> list[Summary]:
    """One summary of `document` per seed, by `outpost run --preset summarize` plus `run_flags`
    (without its repeat guard where `guard` is False: the preset as it was before it had one)."""
    from outpost.serving.assembly import Engine

    args = build_parser().parse_args(["run", "-m", model, "--preset", "summarize", *run_flags])
    settings = replace(run_settings(args), stop_on_loop=guard)
    text = document.read_text(encoding="utf-8")
    out: list[Summary] = []
    with Engine(_engine_config(args, settings.ctx_size), max_queue=1) as engine:
        for seed in seeds:
            seeded = replace(settings, sampling=replace(settings.sampling, seed=seed))
            session = new_session(engine, seeded, out=io.StringIO())
            session.err = io.StringIO()
            answer = session.ask(text)
            n = session.last_timings.predicted_n
            out.append(Summary(seed, n, session.last_finish, session.last_looped, answer.strip()))
    return out


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    run_flags = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.summarize_seeds", description=__doc__)
    p.add_argument("-m", "--model", required=True, help="GGUF file (the real SmolLM2-135M-Instruct)")
    p.add_argument("--seeds", default="1-24", help="a range, e.g. 1-24 (default)")
    p.add_argument("--no-guard", action="store_true", help="turn the preset's repeat guard off")
    args = p.parse_args(own)
    results = summarize(args.model, _seeds(args.seeds), run_flags, guard=not args.no_guard)
    for r in results:
        head = r.text.replace("\n", " ")[:60]
        end = "repeat guard" if r.looped else r.finish
        size = f"{r.n_generated:4d} tokens {len(r.text.split()):4d} words"
        print(f"seed {r.seed:3d}: {size}, {end}, subject={r.names_subject}: {head}")
    ended = sum(r.ended_by_itself for r in results)
    looped = sum(r.looped for r in results)
    named = sum(r.names_subject for r in results)
    print(f"flags {' '.join(run_flags) or '(preset only)'}: of {len(results)} summaries {ended} ended by")
    print(f"themselves, {looped} stopped at the repeat guard; {named} name the subject")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
