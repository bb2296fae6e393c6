"""benchmarks/engine/widths.py without a model: how --widths is read, the table, the plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from benchmarks.engine.widths import markdown, parse_widths, plot, summary


def test_widths_are_ranges_or_lists_each_once_in_order() -> None:
    assert parse_widths("1-4") == [1, 2, 3, 4]
    assert parse_widths("3,4,7,8") == [3, 4, 7, 8]
    assert parse_widths("1-3,2,16") == [1, 2, 3, 16]
    with pytest.raises(ValueError):
        parse_widths("0-2")
    with pytest.raises(ValueError):
        parse_widths("four")


def test_a_steps_milliseconds_are_its_width_over_the_median_rate(tmp_path: Path) -> None:
    rows = summary({4: [100.0, 200.0, 160.0], 16: [200.0, 190.0]})
    assert rows == {4: {"tok_s": 160.0, "ms_step": 25.0}, 16: {"tok_s": 195.0, "ms_step": 82.1}}
    table = markdown(rows).splitlines()
    assert table[0] == "| sequences | decode tok/s | ms a step |" and table[2:] == [
        "| 4 | 160.0 | 25.0 |",
        "| 16 | 195.0 | 82.1 |",
    ]
    plot(rows, "a title " * 30, tmp_path / "w.png")
    assert Image.open(tmp_path / "w.png").size[0] > 0
