"""benchmarks/engine/ratios.py and plot.py without a model: 8 sequences over each single stream, by
round, and the figure of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from benchmarks.engine.plot import panels, plot, series
from benchmarks.engine.ratios import medians, ratios_to_single


def test_each_round_divides_by_its_own_single_streams_and_the_same_cells_one_gets_the_plain_keys() -> None:
    ours = [{"1": 100.0, "8": 400.0}, {"1": 90.0, "8": 300.0}, {"1": 110.0, "8": 500.0}]
    singles = [
        {"same_cells": 200.0, "kv192": 250.0},
        {"same_cells": 100.0, "kv192": 200.0},
        {"same_cells": 250.0, "kv192": 250.0},
    ]
    got = ratios_to_single(ours, singles)
    assert got["batched_8_over_single_rounds"] == [2.0, 3.0, 2.0]
    assert got["batched_8_over_single"] == 2.0  # the median of the rounds' ratios, not of the rates
    assert got["single_tok_s_in_rounds"] == 200.0 and got["single_tok_s_rounds"] == [200.0, 100.0, 250.0]
    assert got["batched_8_over_single_rounds_kv192"] == [1.6, 1.5, 2.0]
    assert got["batched_8_over_single_kv192"] == 1.6
    assert got["single_tok_s_in_rounds_kv192"] == 250.0


def test_medians_are_per_width_over_rounds() -> None:
    assert medians([{"8": 1.0}, {"8": 3.0}, {"8": 2.0}]) == {"8": 2.0}


def test_the_plot_draws_each_shape_and_refuses_a_file_without_batched_results(tmp_path: Path) -> None:
    shape = {
        "batched_tok_s": {"1": 200.0, "2": 210.0, "4": 320.0, "8": 420.0},
        "batched_tok_s_rounds": [{"1": 190.0, "2": 200.0, "4": 300.0, "8": 410.0}] * 3,
        "llama_batched_bench_tok_s": {"1": 230.0, "2": 230.0, "4": 330.0, "8": 450.0},
        "single_tok_s_in_rounds": 230.0,
        "batched_8_over_single": 1.83,
    }
    assert series(shape)["widths"] == [1, 2, 4, 8] and series(shape)["llama"] == [230.0, 230.0, 330.0, 450.0]
    runs = {"run-1": {"smollm2-135m": shape, "copy_bandwidth_gb_s": 25.0}, "run-2": {"smollm2-135m": shape}}
    assert list(panels(runs)) == ["run-1: smollm2-135m", "run-2: smollm2-135m"]
    assert list(panels({"run-1": runs["run-1"]})) == ["smollm2-135m"]
    plot(runs, tmp_path / "e.png", "a title " * 30)
    assert Image.open(tmp_path / "e.png").size[0] > 0
    with pytest.raises(ValueError, match="no batched results"):
        plot({"run": {"copy_bandwidth_gb_s": 25.0}}, tmp_path / "f.png", "t")
