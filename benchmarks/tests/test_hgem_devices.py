"""The GPU-against-CPU H-GEM benchmark's three steps at a tiny size on the CPU (no GPU here: a
``cuda`` device is skipped), and its state-level scorer against the peer benchmark's."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_benchmark

TINY = {"rounds": 1, "pretrain_steps": 5, "initial_update_steps": 5, "max_update_steps": 3, "batch_size": 16,
        "hidden": [16], "z_dim": 4, "kway_per_group_count": 2}


@pytest.fixture(scope="module")
def hd():
    return load_benchmark("hgem_devices")


def test_prepare_run_score_end_to_end(hd, data_root, tmp_path):
    d, runs, results = tmp_path / "prep", tmp_path / "runs", tmp_path / "results"
    assert hd.main(["prepare", "--dir", str(d), "--inputs", "none", "--epsilons", "1,0.25"]) == 0
    spec = json.loads((d / "cells.json").read_text())
    assert [c["epsilon"] for c in spec["cells"]] == [1.0, 0.25]
    rho = [hd.Fraction(c["rho"]) for c in spec["cells"]]
    assert 0 < rho[1] < rho[0]  # the release's allocation to the H-GEM state stage, smaller at the smaller ε
    assert spec["settings"]["update"] == "map" and spec["initial_workloads"]  # the shipped rule, public-selected workloads
    spec["settings"].update(TINY)
    (d / "cells.json").write_text(json.dumps(spec))
    assert hd.main(["run", "--dir", str(d), "--devices", "cuda,cpu", "--jobs", "2", "--out", str(runs)]) == 0
    timings = json.loads((runs / "timings.json").read_text())
    import torch

    assert ("cuda" in timings["devices"]) == torch.cuda.is_available()  # a device that is not there is skipped
    cpu = timings["devices"]["cpu"]
    assert sorted(c["index"] for c in cpu["cells"]) == [0, 1] and cpu["pretrain_seconds"] > 0
    assert hd.main(["score", "--dir", str(d), "--runs", str(runs), "--out", str(results)]) == 0
    rows = json.loads((results / "hgem_devices.json").read_text())["rows"]
    synth = [r for r in rows if r["device"] == "cpu"]
    assert len(synth) == 2 and all(0 < r["mean_l1"] <= 2 and r["contains_l1"] > 0 and r["marginals"] == 120 for r in synth)
    assert any(r["device"] == "public resampled" for r in rows)
    assert "cpu" in (results / "hgem_devices.txt").read_text()
    private = hd.HierarchicalData.from_npz(d / "none.npz")
    with np.load(runs / "samples_cpu.npz") as z:
        got = hd.cell_samples(z, 0)
    assert got.domain == private.domain and got.n_households == 2 * private.n_households  # support_per_household × N_G


def test_state_score_is_the_peer_scorers_mean_over_the_marginals_without_puma(hd, data_root):
    pc = load_benchmark("peer_comparison")
    bench = pc.private_bench("vt", 8, None, pc.argparse.ArgumentParser())
    from schemas.ingestion import HouseholdRules, load_person_file

    data, _ = load_person_file(pc.DATA / pc.state_zip("vt"), bench.spec, HouseholdRules(8, "single_person_households", "clip"))
    full = bench.score(bench.records(data), bench.households(data))["l1_by_kind"]
    k = len(pc.PERSON_ATTRS)
    n_np, n_person = k * (k - 1) // 2, k * (k - 1) * (k - 2) // 6  # triples with NP and no PUMA; persons only
    expect = (n_np * full["with NP, no PUMA"] + n_person * full["person attributes only"]) / (n_np + n_person)
    got = hd.state_score(bench, data)
    assert got["marginals"] == n_np + n_person == 120
    assert got["mean_l1"] == pytest.approx(expect, rel=1e-12)
    assert 0 < got["mean_l1"] < 0.05  # only the clip to 8 persons separates it from the truth
