"""tasks/count_of_counts.py: the count stages' measurements in groups of whole states, one task per
group (the flow spreads them over the workers), then one fit over every group's noisy counts.

The result must not depend on the grouping: a fit over three groups and a fit over one, on the same
stored measurements, write the same arrays, and the second charges nothing. Vermont private with
New Hampshire, Maine and Rhode Island declared beside it (their PUMAs hold no private household:
nodes like every other, measured with the same noise). No Prefect server: the tasks' ``.fn`` are
called directly.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import DATA_ROOT, encode_inputs

STATES = [23, 33, 44, 50]  # Maine, New Hampshire, Rhode Island, Vermont


def make_config():
    from schemas.release_config import ReleaseConfig

    return ReleaseConfig.model_validate({
        "name": "coc-task-test",
        "data_root": str(DATA_ROOT),
        "private": [{"path": "acs2018_1yr/csv_pvt.zip"}],
        "public": [{"path": "acs2018_1yr/csv_pnh.zip"}],
        "geography": {"states": STATES},
        "budget": {"rho": 0.05},
        "advanced": {"allocation": {
            "stages": {"group_counts": 0.05, "count_of_counts": 0.05, "state_synthesis": 0.5, "puma_synthesis": 0.4},
            "levels": {"group_counts": {"state": 0.5, "puma": 0.5}, "count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5},
                       "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}},
            "synthesis_split": "fixed"}},
    })


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_root):
    return encode_inputs(make_config(), tmp_path_factory.mktemp("coc-inputs"))


def context(tmp, inputs):
    from tasks.context import RunContext
    from tasks.ingest import release_geography
    from tasks.run_context import prepare

    cfg = make_config()
    return RunContext(cfg, prepare(tmp / "work", tmp / "rel"), inputs["private"], inputs["public"], release_geography(cfg, inputs["private"]))


def fit(ctx, parts: int, sizes: bool = True) -> dict[str, np.ndarray]:
    from engine.data import read_npz
    from tasks.count_of_counts import count_of_counts_task, hierarchy_of, household_counts_task, measure_nodes_task, node_parts

    measured = [measure_nodes_task.fn(ctx, ids, sizes) for ids in node_parts(hierarchy_of(ctx.geography), parts)]
    path = (count_of_counts_task if sizes else household_counts_task).fn(ctx, measured)
    names = ["keys", "level", "households", "households_sd"] + (["histograms", "raw_histograms", "histogram_sd"] if sizes else [])
    z = read_npz(path, names)
    return {k: np.asarray(z[k]) for k in names}


def test_node_parts_hold_whole_states_cover_every_node_once_and_balance():
    from engine.count_of_counts import geography_hierarchy
    from tasks.count_of_counts import node_parts

    # states with 1, 2, ..., 9 PUMAs
    pumas = np.array([(s, p) for s in range(1, 10) for p in range(100, 100 + s)], dtype=np.int64)
    h = geography_hierarchy(pumas)
    for parts in (0, 1, 2, 3, 8, 20):
        groups = node_parts(h, parts)
        assert len(groups) == max(1, min(parts, 9))
        ids = np.concatenate(groups)
        assert np.array_equal(np.sort(ids), np.arange(h.n_nodes))  # every node, once
        assert 0 in groups[0]  # the nation
        for g in groups:
            states = set(g[h.level[g] == 1].tolist())
            assert {int(h.parent[i]) for i in g[h.level[g] == 2]} <= states  # a PUMA travels with its state
            assert all(np.isin(np.flatnonzero(h.parent == s), g).all() for s in states)  # all of them
        if parts == 2:  # states of 10, 9, ..., 2 nodes, each onto the smaller group: 10+7+6+3+2 and 9+8+5+4
            assert sorted(int((h.level[g] > 0).sum()) for g in groups) == [26, 28]


def test_groups_do_not_change_the_fit_and_measure_each_node_once(tmp_path, inputs):
    from tasks.count_of_counts import hierarchy_of

    ctx = context(tmp_path, inputs)
    h = hierarchy_of(ctx.geography)
    assert h.n_nodes == 1 + len(STATES) + int((h.level == 2).sum()) and int((h.level == 2).sum()) > len(STATES)
    three = fit(ctx, 3)
    charges = ctx.ledger.charges()
    # count_of_counts: every node of every level once; group_counts: every state and PUMA once
    assert sorted(c.stage for c in charges) == sorted(["count_of_counts"] * h.n_nodes + ["group_counts"] * (h.n_nodes - 1))
    assert len({c.key for c in charges}) == len(charges)
    (ctx.paths.node_path("count_of_counts", "hierarchy")).unlink()
    one = fit(ctx, 1)
    assert len(ctx.ledger.charges()) == len(charges)  # read back, charged nothing
    for k in three:
        np.testing.assert_array_equal(three[k], one[k], err_msg=k)
    # the raw histograms are the stored noisy measurements, row by row in the hierarchy's order
    stored = {m.key: m for m in ctx.store.all()}
    for i in (0, 1, h.n_nodes - 1):
        m = stored[f"count_of_counts/{h.keys[i]}/sizes"]
        assert m.workload_id == "size_histogram" and np.array_equal(three["raw_histograms"][i], m.noisy_answer)
    assert three["keys"].tolist() == h.keys
    # the fit is consistent: the children's households sum to their parent's
    G = three["households"]
    for i in h.level_range(1):
        assert G[np.flatnonzero(h.parent == i)].sum() == G[i]
    assert G[h.level_range(1)].sum() == G[0]


def test_household_counts_alone_from_groups(tmp_path, inputs):
    from tasks.count_of_counts import hierarchy_of

    ctx = context(tmp_path, inputs)
    h = hierarchy_of(ctx.geography)
    got = fit(ctx, 2, sizes=False)
    assert [c.stage for c in ctx.ledger.charges()] == ["group_counts"] * (h.n_nodes - 1)
    assert np.all(np.isinf(got["households_sd"][h.level_range(0)]))  # the nation is not measured by that stage
    assert np.all(np.isfinite(got["households_sd"][h.level > 0]))


def test_a_fit_refuses_groups_that_leave_out_a_node(tmp_path, inputs):
    from engine.errors import PrivacyInvariantError
    from tasks.count_of_counts import count_of_counts_task, hierarchy_of, measure_nodes_task, node_parts

    ctx = context(tmp_path, inputs)
    groups = node_parts(hierarchy_of(ctx.geography), 2)
    with pytest.raises(PrivacyInvariantError, match="cover every node"):
        count_of_counts_task.fn(ctx, [measure_nodes_task.fn(ctx, groups[0], True)])
