"""The household-total bias benchmark's pooled summary: every node of every release counted once."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark

bias = load_benchmark("household_total_bias")


def run(errors: dict[str, list[float]], sd: float) -> dict[str, dict[str, np.ndarray]]:
    return {lv: {**{s: np.array(errors.get(lv, [np.nan]), dtype=np.float64) for s in bias.STAGES},
                 "dp_sd": np.full(len(errors.get(lv, [np.nan])), sd)} for lv in bias.LEVELS}


def test_pooled_takes_every_node_of_every_run():
    runs = {"a": run({"state": [1.0, 3.0], "puma": [2.0]}, 2.0), "b": run({"state": [-4.0], "puma": [0.0, 4.0]}, 4.0)}
    out = bias.pooled(runs)
    state = out["state"]["released"]
    assert state["nodes"] == 3 and state["mean"] == pytest.approx(0.0)
    assert state["se"] == pytest.approx(np.std([1.0, 3.0, -4.0], ddof=1) / np.sqrt(3))
    assert state["rms"] == pytest.approx(np.sqrt((1 + 9 + 16) / 3))
    assert state["dp_sd"] == pytest.approx(np.sqrt((4 + 4 + 16) / 3))
    assert out["puma"]["fitted"]["mean"] == pytest.approx(2.0)
    # a level no release has (here the nation: NaN for every stage) is left out, not counted as zero error
    assert out["nation"] == {}


def test_pooled_mean_moves_with_a_biased_release():
    unbiased = bias.pooled({"a": run({"state": [1.0, -1.0]}, 1.0)})["state"]["released"]["mean"]
    biased = bias.pooled({"a": run({"state": [1.0, -1.0]}, 1.0), "b": run({"state": [9.0, 11.0]}, 1.0)})["state"]["released"]["mean"]
    assert unbiased == pytest.approx(0.0) and biased == pytest.approx(5.0)
