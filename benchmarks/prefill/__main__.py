"""`python -m benchmarks.prefill {budget,replay} --help`: the prefill-budget benchmark (budget.py)
or the replay of a recorded prompt mix (replay.py)."""

import sys

from benchmarks.prefill import budget, replay

COMMANDS = {"budget": budget.main, "replay": replay.main}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(f"usage: python -m benchmarks.prefill {{{','.join(COMMANDS)}}} [--help]")
    command = sys.argv.pop(1)
    sys.argv[0] = f"python -m benchmarks.prefill {command}"
    raise SystemExit(COMMANDS[command]())
