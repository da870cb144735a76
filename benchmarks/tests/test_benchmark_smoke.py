"""Smoke test of benchmarks/synthesis_accuracy.py at a tiny size (1 ε, 1 run, Vermont private,
New Hampshire public, a few workloads) — the whole driver end to end, plus the benchmark's cached
evaluator against engine.queries."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("synthesis_accuracy")


def test_benchmark_runs_end_to_end(bench, data_root, tmp_path, capsys):
    rc = bench.main([
        "--private", "vt", "--public", "nh", "--epsilons", "1", "--runs", "1", "--workloads", "5", "--pairs", "10",
        "--methods", "map,ide,public,indep,mwem", "--mwem-rounds", "3,2", "--out", str(tmp_path), "--tag", "smoke",
    ])
    assert rc == 0
    res = json.loads((tmp_path / "synthesis_accuracy_smoke.json").read_text())
    assert (tmp_path / "synthesis_accuracy_smoke.png").stat().st_size > 0
    assert set(res["summary"]) == {"map", "ide", "public", "indep", "mwem"}
    for m, by_eps in res["summary"].items():
        for k in bench.METRICS:
            v = by_eps["1.0"][k]["mean"]
            assert np.isfinite(v) and v >= 0, (m, k, v)
    assert res["timing"]["map_s"][0] > 0 and res["timing"]["public_s"][0] > 0
    out = capsys.readouterr().out
    assert "l1_2way_PUMA" in out and "public-only" in out


def test_evaluator_matches_engine_metrics(bench, vermont):
    from engine.queries import query_errors, two_way_l1

    true, _ = vermont
    rng = np.random.default_rng(3)
    synth = true.take(rng.integers(0, true.n_households, true.n_households))
    gw, pw = bench.eval_workloads(true.domain, 6, seed=1)
    ev = bench.Evaluator(true, gw, pw, n_pairs=10, pair_seed=5)
    got = ev(synth)
    for level, ws in (("group", gw), ("person", pw)):
        for geo in ("ST", "PUMA"):
            ref = query_errors(true, synth, ws, geo)
            assert got[f"{level}_max_{geo}"] == pytest.approx(ref["max_error"], rel=1e-12, abs=1e-15)
            assert got[f"{level}_mean_{geo}"] == pytest.approx(ref["mean_error"], rel=1e-12, abs=1e-15)
    ref2 = two_way_l1(true, synth, "PUMA", n_pairs=10, rng=np.random.default_rng(5))
    assert got["l1_2way_PUMA"] == pytest.approx(ref2["mean_l1"])


def test_helpers(bench, vermont):
    data, _ = vermont
    big = bench.replicate(data, 3)
    assert big.n_households == 3 * data.n_households
    assert len(big.nodes("PUMA")) == 3 * len(data.nodes("PUMA"))
    assert len(big.nodes("ST")) == len(data.nodes("ST"))
    w = bench.distinct_uniform_weights(data)
    assert w.sum() == pytest.approx(1.0)
    # duplicates share the weight of one distinct household
    assert w.min() < w.max()
    rng = np.random.default_rng(0)
    noise = bench.NumpyNoise(rng)
    picks = [noise.permute_and_flip(np.array([0.0, 0.0, 50.0]), 1.0, 1.0) for _ in range(50)]
    assert all(p == 2 for p in picks)
