"""The public-floor sweep's table (benchmarks/public_floor_sweep.py): each state's ratio of the
pipeline's mean L1 to the public-only baseline's, and the cells where the pipeline is above it."""

from __future__ import annotations

import json

from conftest import load_benchmark


def _summary(dp: float | None, pub: float) -> dict:
    out = {"public": {"0.1": {"mean_l1": {"mean": pub, "se": None, "n": 1}}}}
    if dp is not None:
        out["dprelease"] = {"0.1": {"mean_l1": {"mean": dp, "se": None, "n": 1}}}
    return {"summary": out}


def test_the_table_names_every_state_above_the_public_baseline(tmp_path):
    sweep = load_benchmark("public_floor_sweep")
    for state, dp, pub in (("nh", 0.15, 0.20), ("nm", 0.30, 0.25), ("vt", None, 0.2)):
        (tmp_path / f"peer_comparison_sweep_{state}.json").write_text(json.dumps(_summary(dp, pub)))
    text = sweep.table(tmp_path, ["nh", "nm", "vt", "wy"], [0.1])
    rows = {line.split()[0]: line for line in text.splitlines() if line[:2] in ("NH", "NM", "VT", "WY")}
    assert "(0.75)" in rows["NH"] and "(1.20)" in rows["NM"] and "—" in rows["VT"] and "WY" not in rows
    assert text.rstrip().endswith("above the public-only baseline: NM at ε = 0.1")
    (tmp_path / "peer_comparison_sweep_nm.json").write_text(json.dumps(_summary(0.2, 0.25)))
    assert sweep.table(tmp_path, ["nh", "nm"], [0.1]).rstrip().endswith("above the public-only baseline: none")
