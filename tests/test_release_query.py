"""dprelease query: marginals of a published release alone, checked against a brute-force count
of the microdata, with the run's measurement of the same marginal and its 90 % interval."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from schemas.release_schema import INTERVALS_SCHEMA, to_tables
from tasks.publish import _write_dataset
from tasks.release_query import Z90, QueryError, node_of, query_release
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain()


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A tiny release: two PUMAs of state 50, and measurements of TEN,R18 at ST=50 by two stages."""
    data = random_data(DOMAIN, 120, seed=4)
    data = data.with_geo(np.stack([np.full(120, 50), np.where(np.arange(120) < 70, 100, 200)], axis=1))
    d = tmp_path_factory.mktemp("release")
    hh, pp = to_tables(data)
    _write_dataset(hh, d / "households")
    _write_dataset(pp, d / "persons")
    (d / "domain.json").write_text(json.dumps(DOMAIN.to_dict()))
    rows = []
    for stage, sd in (("state_synthesis", 4.0), ("puma_synthesis", 3.0)):
        for i, (r, t) in enumerate(itertools.product(range(2), range(3))):  # workload order R18, TEN
            rows.append({"workload_id": "group:R18,TEN|", "node": "ST=50", "cell_codes": f"R18={r}; TEN={t}",
                         "noisy_value": float(10 * i + (1 if stage == "state_synthesis" else -1)), "noise_sd": sd, "stage": stage})
    pq.write_table(pa.Table.from_pylist(rows), d / "measurements.parquet")
    iv = []  # error estimates of the released answers: TEN,R18 at ST=50 (a marginal), the sizes at PUMA 00100
    for i, (r, t) in enumerate(itertools.product(range(2), range(3))):
        iv.append({"table": "marginal", "level": "state", "node": "ST=50", "marginal": "group:R18,TEN|", "cell": i,
                   "cell_codes": f"R18={r}; TEN={t}", "released": 0.0, "se": 1.0 + i, "bias": 0.0, "lo90": 100.0 + i,
                   "hi90": 200.0 + i, "method": "map_eb"})
    for source, se in (("size_histogram", 5.0), ("group:NP|", 2.0)):
        for k in range(1, DOMAIN.max_size + 1):
            iv.append({"table": "count_of_counts" if source == "size_histogram" else "marginal", "level": "puma",
                       "node": "ST=50/PUMA=00100", "marginal": source, "cell": k - 1, "cell_codes": f"NP={k}", "released": 0.0,
                       "se": se, "bias": 0.0, "lo90": 10.0 * k, "hi90": 10.0 * k + se, "method": "x"})
    pq.write_table(pa.Table.from_pylist(iv, schema=INTERVALS_SCHEMA), d / "intervals.parquet")
    return d, data


def brute(data, level, attrs, where_puma=None):
    """Counts by explicit loops over households and persons."""
    out = {}
    for h in range(data.n_households):
        if where_puma is not None and data.geo[h, 1] != where_puma:
            continue
        persons = range(int(data.person_offsets[h]), int(data.person_offsets[h + 1]))
        for r in (persons if level == "person" else [None]):
            key = []
            for a in attrs:
                if a in [g.name for g in DOMAIN.group]:
                    key.append(DOMAIN.group_attribute(a).codes[data.group[h, DOMAIN.group_index(a)]])
                else:
                    key.append(DOMAIN.person_attribute(a).codes[data.person[r, DOMAIN.person_index(a)]])
            out[tuple(key)] = out.get(tuple(key), 0) + 1
    return out


@pytest.mark.parametrize(("level", "margin", "puma"), [("group", ["TEN", "R18"], None), ("person", ["SEX", "TEN"], 100),
                                                       ("person", ["AGE"], None), ("group", ["NP"], 200)])
def test_answers_equal_a_brute_force_count(release, level, margin, puma):
    d, data = release
    where = {"ST": "50", **({"PUMA": f"{puma:05d}"} if puma else {})}
    t = query_release(d, margin, level, where)
    expected = brute(data, level, margin, puma)
    assert len(t) == int(np.prod([len(DOMAIN.group_attribute(a).codes) if a in [g.name for g in DOMAIN.group]
                                  else len(DOMAIN.person_attribute(a).codes) for a in margin]))  # every cell, zeros too
    got = {tuple(r[a] for a in margin): int(r["count"]) for _, r in t.iterrows()}
    assert {k: v for k, v in got.items() if v} == expected
    assert abs(t.share.sum() - 1) < 1e-12 and all(f"{a}_label" in t.columns for a in margin)


def test_the_measured_marginal_is_attached_merged_by_inverse_variance(release):
    d, _ = release
    t = query_release(d, ["TEN", "R18"], "group", {"ST": "50"})
    w = np.array([1 / 16, 1 / 9])
    for _, r in t.iterrows():
        i = int(r["R18"]) * 3 + int(r["TEN"])  # the stored cell order (R18 slowest)
        expected = (w @ [10 * i + 1, 10 * i - 1]) / w.sum()
        assert r["measured"] == pytest.approx(expected) and r["measured_sd"] == pytest.approx(1 / np.sqrt(w.sum()))
        assert r["measured_upper_90"] - r["measured"] == pytest.approx(Z90 * r["measured_sd"])
    assert "measured" not in query_release(d, ["TEN", "R18"], "group", {"ST": "50", "PUMA": "00100"}).columns  # other node
    assert "measured" not in query_release(d, ["TEN"], "group", {"ST": "50"}).columns  # other marginal


def test_the_released_count_gets_its_interval_from_the_release(release):
    d, _ = release
    t = query_release(d, ["TEN", "R18"], "group", {"ST": "50"})  # margin order differs from the stored workload's
    for _, r in t.iterrows():
        i = int(r["R18"]) * 3 + int(r["TEN"])
        assert (r["count_se"], r["count_lower_90"], r["count_upper_90"]) == (1.0 + i, 100.0 + i, 200.0 + i)
    sizes = query_release(d, ["NP"], "group", {"ST": "50", "PUMA": "00100"})
    assert sizes.count_se.tolist() == [2.0] * 4  # the synthesis fit's (group:NP|) before the bootstrap's
    assert sizes.count_lower_90.tolist() == [10.0 * k for k in range(1, 5)]
    for margin, where in ((["TEN", "R18"], {"ST": "50", "PUMA": "00100"}), (["TEN"], {"ST": "50"}), (["NP"], {"ST": "50"}),
                          (["NP"], {"TEN": "1"})):
        assert "count_se" not in query_release(d, margin, "group", where).columns  # no estimate of exactly that there


def test_node_keys_and_refusals(release):
    d, _ = release
    assert node_of({}, ["ST", "PUMA"]) == "nation" and node_of({"ST": "50"}, ["ST", "PUMA"]) == "ST=50"
    assert node_of({"PUMA": "00100"}, ["ST", "PUMA"]) is None and node_of({"ST": "50", "SEX": "1"}, ["ST", "PUMA"]) is None
    with pytest.raises(QueryError, match="person attribute"):
        query_release(d, ["SEX"], "group")
    with pytest.raises(QueryError, match="unknown attribute"):
        query_release(d, ["FOO"], "person")
    with pytest.raises(QueryError, match="not a household column"):
        query_release(d, ["TEN"], "group", {"SEX": "1"})
    with pytest.raises(QueryError, match="no domain.json"):
        query_release(d / "households", ["TEN"], "group")


def test_the_command_line(release, tmp_path, capsys):
    d, data = release
    assert main(["query", str(d), "--margin", "TEN,R18", "--level", "group", "--where", "ST=50"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"TEN,R18 over {data.n_households} synthetic households (ST=50); the counts are of the synthetic sample")
    assert "measured_lower_90" in out and "e+0" not in out
    assert "count_lower_90" in out and "the released count's standard error and 90 % interval" in out
    assert main(["query", str(d), "--margin", "TEN", "--level", "group", "--where", "ST=50"]) == 0
    assert "no interval for the released count: it is a sum of cells of the measured group:R18,TEN| at ST=50" in capsys.readouterr().out
    assert main(["query", str(d), "--margin", "SEX", "--level", "person", "--format", "csv"]) == 0
    csv = pd.read_csv(pd.io.common.StringIO(capsys.readouterr().out))
    assert list(csv.columns) == ["SEX", "SEX_label", "count", "share"] and csv["count"].sum() == data.n_persons
    assert main(["query", str(d), "--margin", "SEX", "--level", "person", "--format", "parquet", "--out", str(tmp_path / "a.parquet")]) == 0
    assert pd.read_parquet(tmp_path / "a.parquet")["count"].sum() == data.n_persons
    assert main(["query", str(d), "--margin", "SEX", "--level", "person", "--where", "ST50"]) == 2
    assert "expected COLUMN=CODE" in capsys.readouterr().err


def test_the_readme_pandas_recipe_reads_what_query_counts(release):
    """The README's pandas recipe, run on a release: ST and PUMA come back as the strings the
    partitions are named by, and its persons joined to their households count what the query counts."""
    d, data = release
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    recipe = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    assert 'release = "releases/acs2018-default"' in recipe
    recipe = recipe.replace('release = "releases/acs2018-default"', f"release = {str(d)!r}")
    scope: dict = {}
    exec("\n".join(line for line in recipe.splitlines() if not line.startswith("print(")), scope)  # its last line needs the ACS domain
    households, people = scope["households"], scope["people"]
    assert sorted(households.PUMA.unique()) == ["00100", "00200"] and set(households.ST) == {"50"}
    assert len(households) == data.n_households and len(people) == data.n_persons
    t = query_release(d, ["SEX", "TEN"], "person", {"ST": "50", "PUMA": "00100"})
    counted = people[(people.ST == "50") & (people.PUMA == "00100")].groupby(["SEX", "TEN"]).size().to_dict()
    assert counted == {(r.SEX, r.TEN): r["count"] for _, r in t.iterrows() if r["count"]}


def test_a_node_the_release_does_not_hold_is_refused(release):
    """An unreleased state or PUMA would answer all zeros, and a PUMA code without its state would
    sum that code across states: both are refused, naming what the release holds."""
    d, _ = release
    with pytest.raises(QueryError, match=r"ST=16: not a node of this release; its ST codes: 50"):
        query_release(d, ["TEN"], "group", {"ST": "16"})
    with pytest.raises(QueryError, match=r"PUMA=00300: not a node of this release; its PUMA codes in ST=50: 00100, 00200"):
        query_release(d, ["SEX"], "person", {"ST": "50", "PUMA": "00300"})
    with pytest.raises(QueryError, match=r"--where PUMA=00100 needs --where ST=…"):
        query_release(d, ["TEN"], "group", {"PUMA": "00100"})
    assert query_release(d, ["TEN"], "group", {"ST": "50", "PUMA": "00200"})["count"].sum() == 50  # a released node answers


def test_a_count_without_interval_says_why(release):
    d, _ = release
    reasons = {
        "sub-marginal": query_release(d, ["TEN"], "group", {"ST": "50"}),
        "not measured": query_release(d, ["TEN", "R18"], "group", {"ST": "50", "PUMA": "00100"}),
        "not a node": query_release(d, ["NP"], "group", {"TEN": "1"}),
    }
    assert reasons["sub-marginal"].attrs["no_interval"].startswith("it is a sum of cells of the measured group:R18,TEN| at ST=50")
    assert reasons["not measured"].attrs["no_interval"].startswith("the run did not measure this marginal at ST=50/PUMA=00100")
    assert reasons["not a node"].attrs["no_interval"].startswith("the filter on TEN is not a geography node")
    assert "no_interval" not in query_release(d, ["TEN", "R18"], "group", {"ST": "50"}).attrs


def test_a_person_marginal_measured_over_the_first_persons_says_so(release, tmp_path):
    d, _ = release
    copy = tmp_path / "r"
    shutil.copytree(d, copy)
    iv = pq.read_table(copy / "intervals.parquet").to_pylist()
    iv.append({**iv[0], "marginal": "person:TEN|SEX;first=2", "cell_codes": "SEX=1; TEN=1"})
    pq.write_table(pa.Table.from_pylist(iv, schema=INTERVALS_SCHEMA), copy / "intervals.parquet")
    t = query_release(copy, ["SEX", "TEN"], "person", {"ST": "50"})
    assert "count_se" not in t.columns
    assert t.attrs["no_interval"] == ("the run measured this marginal at ST=50 only over the first 2 persons of each household "
                                      "(person:TEN|SEX;first=2), not as the released count of every record")


def test_readable_numbers():
    from flows.cli import readable

    t = pd.DataFrame({"SEX": ["1"], "count": [12934], "share": [0.51234], "count_se": [123.456], "count_lower_90": [12731.2],
                      "measured": [12950.4], "measured_sd": [30.04]})
    assert readable(t).iloc[0].tolist() == ["1", "12,934", "51.2 %", "123.5", "12,731", "12,950", "30.0"]
