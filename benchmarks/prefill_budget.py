"""Entry point of the prefill-budget benchmark (benchmarks/prefill/budget.py):
`python benchmarks/prefill_budget.py --help`."""

from prefill.budget import main

if __name__ == "__main__":
    raise SystemExit(main())
