"""The paired rerun's bookkeeping (benchmarks/paired_rerun.py): what a rerun deletes and keeps, and
the per-seed differences of its summary. The pipeline runs themselves are the benchmark's."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def pr():
    return load_benchmark("paired_rerun")


def test_a_rerun_keeps_the_measurements_and_the_ledger_and_rebuilds_the_rest(pr, tmp_path):
    work, release = tmp_path / "work" / "run", tmp_path / "releases" / "run"
    for d in ("measurements", "nodes/puma_households", "qa", "inputs"):
        (work / d).mkdir(parents=True)
    (work / "measurements" / "m.npz").write_bytes(b"noisy")
    (work / "nodes" / "puma_households" / "n.npz").write_bytes(b"draw")
    (work / "ledger.jsonl").write_text('{"rho": "1/100"}\n')
    (work / "sampling_seed.json").write_text("{}")
    release.mkdir(parents=True)
    (release / "manifest.json").write_text("{}")
    digest = pr.clear_for_rerun(work, release)
    assert not (work / "nodes").exists() and not (work / "qa").exists() and not release.exists()
    assert (work / "measurements" / "m.npz").read_bytes() == b"noisy" and (work / "sampling_seed.json").exists()
    assert digest == pr.ledger_digest(work)
    (work / "ledger.jsonl").write_text('{"rho": "1/100"}\n{"rho": "1/50"}\n')  # a rerun that charged
    assert pr.ledger_digest(work) != digest


def test_a_run_without_stored_measurements_is_refused(pr, tmp_path):
    (tmp_path / "work").mkdir()
    with pytest.raises(FileNotFoundError, match="no ledger"):
        pr.clear_for_rerun(tmp_path / "work", tmp_path / "release")


def _record(eps, seed, source, l1, kinds=(0.1, 0.2, 0.3), digest=None):
    return {"epsilon": eps, "seed": seed, "source": source, "wall_s": 10.0, "mean_l1": l1, "release_digest": digest,
            "by_kind": dict(zip(("with PUMA", "with NP, no PUMA", "person attributes only"), kinds))}


def test_the_summary_pairs_each_seed_with_the_first_source(pr):
    records = [
        _record(1.0, 0, "base", 0.100, digest="a"), _record(1.0, 0, "new", 0.098, (0.1, 0.2, 0.29), digest="b"),
        _record(1.0, 1, "base", 0.090, digest="c"), _record(1.0, 1, "new", 0.091, (0.1, 0.2, 0.31), digest="c"),
        _record(1.0, 2, "base", 0.080),  # "new" did not finish seed 2: left out of both sides
        {"epsilon": 1.0, "seed": 2, "source": "new", "error": "exited 1"},
    ]
    s = pr.paired_summary(records, ["base", "new"])["1.0"]
    assert s["seeds"] == [0, 1]
    assert s["sources"]["base"]["mean_l1"]["mean"] == pytest.approx(0.095)
    d = s["differences"]["new"]
    assert d["mean_l1"]["mean"] == pytest.approx((-0.002 + 0.001) / 2)
    assert d["mean_l1"]["se"] == pytest.approx(0.0015)  # sd of (−0.002, 0.001) over √2
    assert d["relative"]["mean"] == pytest.approx((-0.002 / 0.100 + 0.001 / 0.090) / 2)
    assert d["lower_on"] == 1 and d["identical_releases"] == 1
    assert d["by_kind"]["person attributes only"]["mean"] == pytest.approx(0.0)
    text = pr.render({"settings": {"private": "nh", "delta": 5e-9, "sources": {n: {"commit": "0" * 40, "dirty": False, "path": "/x"} for n in ("base", "new")},
                                   "started": "now", "cpus": 2},
                      "summary": {"1.0": s}, "records": records, "code": {"commit": "abc"}})
    assert "new − base: -0.0005 ± 0.0015 (-0.44 %), lower on 1 of 2 seeds, the same release on 1" in text and "errors:" in text


def test_the_release_digest_sees_one_changed_record(pr):
    codes = np.arange(12, dtype=np.int64).reshape(4, 3)
    h = {"hh": np.array([0, 0, 1, 2]), "np": np.array([1, 0, 0]), "puma": np.array([0, 1, 1])}
    same = pr.scored_digest(codes.copy(), {k: v.copy() for k, v in h.items()})
    assert pr.scored_digest(codes, h) == same
    codes[3, 2] += 1
    assert pr.scored_digest(codes, h) != same
    codes[3, 2] -= 1
    h["hh"][3] = 1  # the same persons in other households
    assert pr.scored_digest(codes, h) != same
