"""The count-of-counts on/off benchmark's summary (benchmarks/coc_effect.py): per metric the means,
standard errors, ratio and Welch z of the difference, which says whether the stage made a metric
worse beyond the runs' noise."""

from __future__ import annotations

import math

import numpy as np
from conftest import load_benchmark


def test_summary_reports_the_difference_in_standard_errors():
    coc = load_benchmark("coc_effect")
    on = [1.0, 1.2, 1.1, 1.3]
    off = [1.0, 0.9, 1.1, 1.0]
    results = {"on": [{"m": x, "only_on": 0.0} for x in on], "off": [{"m": x} for x in off]}
    table = coc.summarise(results)
    assert list(table) == ["m"]  # a metric missing from one variant is not compared
    row = table["m"]
    se_on, se_off = np.std(on, ddof=1) / 2, np.std(off, ddof=1) / 2
    assert math.isclose(row["on"], 1.15) and math.isclose(row["off"], 1.0)
    assert math.isclose(row["on_se"], se_on) and math.isclose(row["off_se"], se_off)
    assert math.isclose(row["ratio"], 1.15)
    assert math.isclose(row["z"], 0.15 / math.hypot(se_on, se_off))  # ≈ 2.3: worse with the stage on
    flipped = coc.summarise({"on": results["off"], "off": results["on"]})["m"]
    assert math.isclose(flipped["z"], -row["z"])
    lines = coc.render(table, 2.0, 4)
    assert lines[0].endswith("eps=2.0, 4 runs") and lines[-1].split()[-1] == f"{row['z']:.2f}"


def test_a_single_run_has_no_standard_error():
    coc = load_benchmark("coc_effect")
    row = coc.summarise({"on": [{"m": 1.0}], "off": [{"m": 2.0}]})["m"]
    assert math.isnan(row["on_se"]) and math.isnan(row["z"]) and row["ratio"] == 0.5
