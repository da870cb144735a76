"""Smoke test of the peer benchmark (benchmarks/peer_comparison.py, benchmarks/peers/): the AIM and
MST ports run end to end on a small slice of Vermont at a tiny size and spend exactly ρ, the numpy
marginals AIM selects with equal mbi's own, and the scorer gives 0 on the truth. Skipped when the
``bench`` extra (mbi) is not installed. The pipeline side is not run here (see the benchmark's
``--quick``)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import load_benchmark

pytest.importorskip("mbi")



@pytest.fixture(scope="module")
def pc():
    return load_benchmark("peer_comparison")


@pytest.fixture(scope="module")
def bench(pc, data_root):
    return pc.Bench("vt", 7)


def test_scorer_is_zero_on_the_truth(pc, bench):
    assert bench.shape == (9, 2, 9, 2, 6, 5, 7, 6, 5, 7, 4)
    assert len(bench.triples) == 165 and bench.n == 6436
    s = bench.score(bench.truth, bench.truth_hh)
    assert s["mean_l1"] == 0 and s["max_cell"] == 0 and s["contains_l1"] == 0
    noisy = bench.truth.copy()
    noisy[:100, 0] = (noisy[:100, 0] + 1) % 9
    scored = bench.score(noisy)
    assert scored["mean_l1"] > 0
    # only AGEP_BAND changed: its marginals carry the error, each kind's mean is over its own triples
    kinds = [pc.marginal_kind(t) for t in bench.triples]
    assert [kinds.count(k) for k in pc.KINDS] == [45, 36, 84]
    assert all(v > 0 for v in scored["l1_by_kind"].values())
    assert sum(scored["l1_by_kind"][k] * kinds.count(k) for k in pc.KINDS) / 165 == pytest.approx(scored["mean_l1"])


def test_aim_and_mst_run_and_spend_rho(pc, bench):
    from peers import aim, mst

    mbi = aim.mbi
    cols = (0, 1, 7, 9)  # AGEP_BAND, SEX, RELP_GROUP, NP
    names = tuple(pc.ATTRS[i] for i in cols)
    rows = bench.truth[:2000][:, cols]
    data = mbi.Dataset({a: rows[:, j] for j, a in enumerate(names)}, mbi.Domain(names, [bench.shape[i] for i in cols]))
    workload = [(t, 1.0) for t in itertools.combinations(names, 3)]
    rho = 0.05
    model, synth, info = aim.run(data, workload, rho, rng=np.random.default_rng(1), rounds=6, max_iters=50, max_model_size=1.0)
    assert info["rho_used"] == pytest.approx(rho, rel=1e-9)
    assert set(synth.domain.attributes) == set(names) and synth.records > 1000
    marg = aim.Marginals(model)
    for cl in (("AGEP_BAND", "SEX", "NP"), ("SEX", "RELP_GROUP"), ("NP",)):
        ref = np.asarray(model.project(cl).datavector(), dtype=np.float64)
        np.testing.assert_allclose(marg(cl), ref, rtol=1e-3, atol=1e-3 * ref.max())
    synth2, info2 = mst.run(data, rho, rng=np.random.default_rng(2), iters=100, select_iters=100, sensitivity=7.0)
    assert len(info2["tree"]) == len(names) - 1
    assert synth2.domain.shape == data.domain.shape


def test_pipeline_configs_set_the_unit_and_synthesizer(pc, bench, tmp_path):
    import yaml

    base = yaml.safe_load(pc.DEFAULT_CONFIG.read_text())
    public = [s for s in pc.STATES if s != "vt"]
    got = {}
    from schemas.release_config import load_config

    for method in ("dprelease", "dprelease_person", "hgem", "public"):
        path = pc.pipeline_config(base, bench, public, method, 1.0, 1e-9, tmp_path)
        cfg = yaml.safe_load(path.read_text())
        got[method] = (cfg["privacy_unit"], cfg["synthesizer"])
        assert cfg.get("advanced") == base.get("advanced") and cfg["budget"]["epsilon"] == 1.0
        load_config(path)  # a config the pipeline accepts, whichever synthesizer
    assert got == {"dprelease": ("household", "prior_update"), "dprelease_person": ("person", "prior_update"),
                   "hgem": ("household", "hgem"), "public": ("household", "public_baseline")}


def test_jams_public_records_are_the_public_states_codes_without_puma(pc, bench):
    nh = pc.Bench("nh", bench.M)
    for clipped, truth in ((False, nh.truth), (True, nh.clipped)):
        pub = bench.public_records(["nh"], clipped)
        np.testing.assert_array_equal(pub, truth[:, : len(pc.ATTRS) - 1])  # every attribute but PUMA, in order
    assert len(bench.public_records(["nh"], True)) == nh.n - nh.clip_removed
