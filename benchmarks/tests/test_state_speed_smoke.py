"""Smoke test of benchmarks/state_speed.py at a small size (Vermont private, New Hampshire public,
one run): the driver runs the engine API with the release config's settings end to end, and a
second run reads the stored measurements back and releases the same digest."""

from __future__ import annotations

import re

from conftest import load_benchmark


def test_state_speed_runs_and_a_rerun_releases_the_same_digest(data_root, tmp_path, capsys):
    bench = load_benchmark("state_speed")
    args = ["--work", str(tmp_path), "--data", str(data_root / "acs2018_1yr"), "--private", "vt", "--public", "nh", "--repeats", "2"]
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    runs = re.findall(r"households (\d+)  release (\w+)", out)
    assert len(runs) == 2 and runs[0] == runs[1] and int(runs[0][0]) > 0, out
