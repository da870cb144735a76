"""Smoke tests of the H-GEM benchmarks at a tiny size: they run the shipped engine functions
(engine.hgem.state, the pipeline's settings object and budget split) end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_benchmark

TINY = ["--epsilons", "1", "--runs", "1", "--rounds", "2", "--tmax", "3", "--batch-size", "16", "--hidden", "16",
        "--z-dim", "4", "--pretrain-steps", "5", "--per-group-count", "2", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_hgem_accuracy_runs_end_to_end(data_root, tmp_path, capsys):
    bench = load_benchmark("hgem_accuracy")
    out = tmp_path / "rows.json"
    assert bench.main(["--methods", "hgem,public,hgem_small,mwem_small", *TINY, "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert {r["method"] for r in rows} == {"hgem", "public", "hgem_small", "mwem_small"}
    assert all(np.isfinite(r["max"]) and 0 <= r["mean"] <= r["max"] for r in rows)
    assert "hgem_small" in capsys.readouterr().out


def test_hgem_accuracy_rho_is_the_pipelines_conversion():
    from engine.privacy import rho_to_eps

    bench = load_benchmark("hgem_accuracy")
    rho = bench.rho_of(0.5, 1e-8)
    assert rho_to_eps(float(rho), 1e-8, "cks") <= 0.5
    assert rho_to_eps(float(rho) * 1.001, 1e-8, "cks") > 0.5  # the largest ρ: CKS, not the simple bound
    assert float(rho) > bench.eps_delta_to_rho(0.5, 1e-8, "simple")


def test_hgem_speed_times_the_shipped_map_update():
    from tests.hgem.conftest import synthetic_data, tiny_domain

    bench = load_benchmark("hgem_speed")
    from engine.hgem.answers import exact_normalised_answers
    from engine.hgem.workloads import kway_workloads

    data = synthetic_data(tiny_domain(), 300, seed=1)
    ws = kway_workloads(data.domain, 2)
    r = bench.time_rounds(data.domain, ws, exact_normalised_answers(data, ws), "cpu", rounds=2, tmax=4, batch_size=8,
                          households=data.n_households, hidden=(8,), z_dim=4)
    assert r["update"] == "map" and r["steps"] == 2 * 4  # every round runs its T_max steps
    assert r["seconds_per_round_mean"] > 0 and r["settings"]["batch_size"] == 8
