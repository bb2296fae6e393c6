"""The suite's own layout: pytest imports test files by their base name (the tiers have no
__init__.py), so two files of one name in two tiers stop the whole run at collection."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_name() -> None:
    names = Counter(p.name for p in TESTS.rglob("*.py") if p.name not in ("__init__.py", "conftest.py"))
    assert [n for n, k in names.items() if k > 1] == []
