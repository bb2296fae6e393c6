"""Entry point of the prefill replay (benchmarks/prefill/replay.py):
`python benchmarks/prefill_replay.py --help`."""

from prefill.replay import main

if __name__ == "__main__":
    raise SystemExit(main())
