"""benchmarks/scale.py: a run's samples are attributed to the right steps and processes."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture(scope="module")
def scale():
    return load_benchmark("scale")


def test_cpu_seconds_go_to_the_step_and_process_that_used_them(scale):
    spans = {"state_synthesis": (10.0, 20.0), "puma_synthesis": (20.0, 30.0)}
    marks = {"start": 0.0, "published": 35.0}
    kinds = {1: "client", 2: "dask_worker", 3: "other", 4: "other"}
    samples = [
        (5.0, {1: 2.0, 2: 1.0}),  # startup: client 2, worker 1
        (15.0, {1: 2.5, 2: 9.0, 3: 1.0}),  # state stage: client 0.5, worker 8, a helper 1
        (25.0, {1: 3.0, 2: 15.0, 4: 0.5}),  # PUMA stage: the first helper has exited, a second starts
        (33.0, {1: 6.0, 2: 15.5, 4: 0.5}),  # publish
    ]
    out = scale.step_cpu(spans, marks, samples, kinds)
    assert out["startup"] == {"total": 3.0, "client": 2.0, "dask_worker_1": 1.0}
    assert out["state_synthesis"] == {"total": 9.5, "client": 0.5, "dask_worker_1": 8.0, "other": 1.0}
    # the exited helper's seconds are not taken back; the new one's count from its start
    assert out["puma_synthesis"] == {"total": 7.0, "client": 0.5, "dask_worker_1": 6.0, "other": 0.5}
    assert out["publish"] == {"total": 3.5, "client": 3.0, "dask_worker_1": 0.5, "other": 0.0}


def test_the_cpu_table_prints_beside_the_stage_wall_times(scale, tmp_path):
    row = {"label": "1x", "states": 12, "pumas": 106, "households": 100, "wall_s": 40.0, "peak_pss_mib": 1000.0,
           "peak_rss_mib": 1100.0, "stages": {"state_synthesis": 10.0}, "peak_step": "state_synthesis", "code": "abc",
           "step_cpu": {"state_synthesis": {"total": 19.0, "client": 1.0, "dask_worker_1": 18.0}}}
    scale.write([row], tmp_path / "scale.txt")
    text = (tmp_path / "scale.txt").read_text()
    assert "  1x state_synthesis             wall 10; total 19, client 1, dask_worker_1 18" in text


def test_paired_reruns_print_beside_the_first_rerun(scale, tmp_path):
    def row(label, wall, state_cpu, paired=True):
        return {"label": label, "states": 12, "pumas": 106, "households": 100, "wall_s": wall, "peak_pss_mib": 1000.0,
                "peak_rss_mib": 1100.0, "stages": {"state_synthesis": wall / 2, "puma_synthesis": 10.0, "publish": 5.0},
                "peak_step": "state_synthesis", "code": label[-1], "paired": paired,
                "step_cpu": {"state_synthesis": {"total": state_cpu + 1, "client": 1.0, "dask_worker_1": state_cpu},
                             "puma_synthesis": {"total": 18.0, "dask_worker_1": 18.0}}}
    rows = [row("1x measured by a", 50.0, 40.0, paired=False), row("1x rerun a", 40.0, 30.0), row("1x rerun b", 34.0, 24.5)]
    lines = scale.paired_lines(rows)
    assert lines[1] == "paired reruns of 1x on the same stored measurements (difference from 1x rerun a):"
    assert len(lines) == 4 and "measured by" not in "".join(lines)  # the measuring run is no rerun
    assert lines[3].startswith("  1x rerun b [b]: wall 34 s (-6); state_synthesis 17 s (-3), worker CPU 24 s (-6); "
                               "puma_synthesis 10 s (+0), worker CPU 18 s (+0); publish 5 s (+0), worker CPU 0 s (+0)")
    scale.write(rows, tmp_path / "scale.txt")
    assert "paired reruns of 1x" in (tmp_path / "scale.txt").read_text()


def test_a_source_that_is_no_checkout_is_refused(scale, tmp_path, capsys):
    with pytest.raises(SystemExit):
        scale.main(["--scales", "1", "--source", f"x={tmp_path}"])
    assert "not a checkout of this repository" in capsys.readouterr().err


def test_the_pss_walk_is_skipped_only_where_no_new_peak_can_be(scale):
    import os

    import psutil

    me = psutil.Process(os.getpid())
    kinds: dict[int, str] = {}
    pss, rss = scale.tree_memory(me, kinds, {}, pss_above=-1.0)
    assert pss is not None and os.getpid() in pss and 0 < sum(pss.values()) <= rss * 1.05  # each PSS ≤ its RSS (read apart)
    assert kinds[os.getpid()] == "client"
    skipped, rss2 = scale.tree_memory(me, kinds, {}, pss_above=10 * rss)  # an RSS sum below a seen PSS sum: no new peak
    assert skipped is None and rss2 > 0
    again, _ = scale.tree_memory(me, kinds, {}, pss_above=rss2 / 10)  # above it: read
    assert again is not None
