"""The release's intervals.parquet (tasks.intervals): the count-of-counts rows from the stored
noise alone, the measured marginals' rows from the synthesis fits' sds and the released
microdata, checked against brute-force counts."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from engine.count_of_counts._geography import geography_hierarchy, size_histograms
from engine.data._geography import LEVELS
from engine.privacy._measurements import MeasurementRecord as Measurement
from engine.queries._queries import Workload, answer
from engine.synthesis._uncertainty import Z90
from schemas.release_schema import INTERVALS_SCHEMA
from tasks.intervals import count_of_counts_intervals, intervals_table, read_state_intervals, state_marginal_intervals, write_state_intervals
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain()
GEO = np.array([[50, 100], [50, 200], [33, 100]])


@pytest.fixture(scope="module")
def data():
    d = random_data(DOMAIN, 300, seed=9)
    return d.with_geo(GEO[np.arange(300) % 3])


def _measurement(stage, level, node, wid, mechanism, scale) -> Measurement:
    return Measurement(f"{stage}/{node}/{wid}", wid, stage, level, node, np.zeros(4), mechanism, scale, 1.0, Fraction(1, 100),
                       None, "", 0.0)


def _coc(data):
    h = geography_hierarchy(GEO)
    H = size_histograms(h, data.geo, data.sizes, DOMAIN.max_size)
    return h, [str(k) for k in h.keys], h.level, H


def test_count_of_counts_rows_come_from_the_released_histograms_and_the_noise_alone(data):
    h, keys, level, H = _coc(data)
    ms = [_measurement("count_of_counts", LEVELS[lv], str(h.keys[i]), "size_histogram", "discrete_gaussian", 3.0)
          for lv in range(3) for i in h.level_range(lv)]
    ms += [_measurement("group_counts", "puma", str(h.keys[i]), "households", "discrete_gaussian", 2.0) for i in h.level_range(2)]
    ms.append(_measurement("state_synthesis", "state", "ST=50", "group:TEN|", "discrete_gaussian", 1.0))  # ignored
    t = count_of_counts_intervals(keys, level, H, ms, DOMAIN, "weighted", False, seed=7, replicates=30)
    assert t.schema == INTERVALS_SCHEMA and t.num_rows == h.n_nodes * DOMAIN.max_size
    df = t.to_pandas()
    assert (df.table == "count_of_counts").all() and (df.method == "parametric_bootstrap").all()
    for i, key in enumerate(keys):
        rows = df[df.node == key]
        assert rows.released.tolist() == H[i, 1:].tolist() and (rows.level == LEVELS[level[i]]).all()
        assert rows.cell_codes.tolist() == [f"NP={k}" for k in range(1, DOMAIN.max_size + 1)]
    assert (df.se > 0).all() and (df.lo90 <= df.released - df.bias).all() and (df.released - df.bias <= df.hi90).all()
    again = count_of_counts_intervals(keys, level, H, ms, DOMAIN, "weighted", False, seed=7, replicates=30)
    other = count_of_counts_intervals(keys, level, H, ms, DOMAIN, "weighted", False, seed=8, replicates=30)
    assert again.equals(t) and not other.equals(t)  # a function of the sampling seed
    exact = count_of_counts_intervals(keys, level, H, ms, DOMAIN, "weighted", True, seed=7, replicates=30).to_pandas()
    assert np.allclose(exact.groupby("node").released.sum(), df.groupby("node").released.sum())
    with pytest.raises(ValueError, match="every level"):
        count_of_counts_intervals(keys, level, H, ms[:3], DOMAIN, "weighted", False, seed=7, replicates=3)


def test_marginal_rows_answer_the_released_microdata(data, tmp_path):
    puma = {"node": "ST=50/PUMA=00100", "answer_sd": {"group:TEN|": [1.0, 2.0, 3.0], "group:NP|": [1.0] * 4}, "total_var": 4.0}
    puma2 = {"node": "ST=50/PUMA=00200", "answer_sd": {"group:TEN|": [1.0, 1.0, 1.0]}, "total_var": 5.0,
             "response_sd": {"group:R18,TEN|": [1.0] * 6}}
    state = {"node": "ST=50", "answer_sd": {"group:NP|": [2.0] * 4, "group:R18,TEN|": [2.0] * 6}, "total_var": 1.0}
    st_data = data.select(data.geo[:, 0] == 50)
    df = state_marginal_intervals([state, puma, puma2], st_data).to_pandas()
    assert set(zip(df.node, df.marginal)) == {("ST=50/PUMA=00100", "group:TEN|"), ("ST=50/PUMA=00100", "group:NP|"),
                                              ("ST=50/PUMA=00200", "group:TEN|"), ("ST=50", "group:R18,TEN|")}  # no state sizes
    node = data.select((data.geo[:, 0] == 50) & (data.geo[:, 1] == 100))
    ten = df[(df.node == "ST=50/PUMA=00100") & (df.marginal == "group:TEN|")]
    brute = [sum(1 for h in range(node.n_households) if node.group[h, DOMAIN.group_index("TEN")] == c) for c in range(3)]
    assert ten.released.tolist() == brute and ten.cell_codes.tolist() == ["TEN=0", "TEN=1", "TEN=2"]
    share = np.array(brute) / node.n_households
    assert ten.se.to_numpy() == pytest.approx(np.sqrt(np.array([1.0, 4.0, 9.0]) + share**2 * 4.0))
    assert ten.hi90.to_numpy() == pytest.approx(ten.released + Z90 * ten.se) and (ten.bias == 0).all()
    st = df[df.node == "ST=50"]
    released = answer(st_data, Workload.from_id("group:R18,TEN|")).reshape(-1)
    assert st.released.tolist() == released.tolist() and (st.level == "state").all()
    # a state's released answer sums its PUMAs': their total variances, not the state fit's
    # and its fit's sd widened by its PUMAs' responses to their own noise
    assert st.se.to_numpy() == pytest.approx(np.sqrt(4.0 + 1.0 + (released / st_data.n_households) ** 2 * (4.0 + 5.0)))
    # a PUMA without released households answers zeros; results without sds (an older run) give no rows
    empty = state_marginal_intervals([puma, {"node": "ST=50/PUMA=00300", "diagnostics": {}}], st_data.take(np.zeros(0, dtype=np.int64)))
    assert set(empty.column("node").to_pylist()) == {"ST=50/PUMA=00100"} and not any(empty.column("released").to_pylist())
    with pytest.raises(ValueError, match="one state"):
        state_marginal_intervals([puma, {"node": "ST=33/PUMA=00100", "answer_sd": {}}], st_data)
    with pytest.raises(ValueError, match="one state"):  # another state's households would be counted as this one's
        state_marginal_intervals([state, puma, puma2], data)


def test_state_interval_parts_are_written_from_the_persisted_results_and_read_back(data, tmp_path):
    records = {"ST=50/PUMA=00100": {"node": "ST=50/PUMA=00100", "answer_sd": {"group:TEN|": [1.0, 2.0, 3.0]}, "total_var": 4.0},
               "ST=50/PUMA=00200": {"node": "ST=50/PUMA=00200", "answer_sd": {"group:TEN|": [1.0] * 3}, "total_var": 5.0,
                                    "response_sd": {"group:R18,TEN|": [1.0] * 6}},
               "ST=33/PUMA=00100": {"node": "ST=33/PUMA=00100", "answer_sd": {"group:TEN|": [2.0] * 3}, "total_var": 1.0}}
    files = {}
    for key, rec in records.items():
        st, puma = (int(x.split("=")[1]) for x in key.split("/"))
        f = tmp_path / f"ST{st}_PUMA{puma:05d}.npz"
        data.select((data.geo[:, 0] == st) & (data.geo[:, 1] == puma)).to_npz(f)
        f.with_suffix(".json").write_text(json.dumps(rec))
        files.setdefault(st, []).append(f)
    state = tmp_path / "ST50.json"
    state.write_text(json.dumps({"node": "ST=50", "answer_sd": {"group:R18,TEN|": [2.0] * 6}, "total_var": 1.0}))
    write_state_intervals(tmp_path / "i50.parquet", state, reversed(files[50]))  # the node files in any order
    write_state_intervals(tmp_path / "i33.parquet", tmp_path / "ST33.json", files[33])  # no state fit (H-GEM)
    part = read_state_intervals([tmp_path / "i50.parquet"])
    assert part.equals(state_marginal_intervals([json.loads(state.read_text()), records["ST=50/PUMA=00100"], records["ST=50/PUMA=00200"]],
                                                data.select(data.geo[:, 0] == 50)))
    table = intervals_table(read_state_intervals([tmp_path / "i33.parquet", tmp_path / "i50.parquet"]))
    assert table.schema == INTERVALS_SCHEMA and table.column("node").to_pylist() == sorted(table.column("node").to_pylist())
    assert set(table.column("node").to_pylist()) == {"ST=33/PUMA=00100", "ST=50/PUMA=00100", "ST=50/PUMA=00200", "ST=50"}
    with pytest.raises(FileNotFoundError, match="interval rows are missing"):
        read_state_intervals([tmp_path / "i99.parquet"])
