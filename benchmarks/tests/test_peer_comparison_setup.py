"""The peer benchmark's set-up that needs no peer (runs without the ``bench`` extra): the pipeline
side clips households as the release config it measures does."""

from __future__ import annotations

import pytest
import yaml
from conftest import load_benchmark


@pytest.fixture(scope="module")
def pc():
    return load_benchmark("peer_comparison")


def test_households_are_clipped_at_the_base_configs_size(pc):
    shipped = yaml.safe_load(pc.DEFAULT_CONFIG.read_text())
    assert pc.household_max_size(shipped) == shipped["household_rules"]["max_household_size"] == 8
    assert pc.household_max_size({**shipped, "household_rules": {"max_household_size": 11}}) == 11
    assert pc.household_max_size({k: v for k, v in shipped.items() if k != "household_rules"}) == 8  # the schema's default


def test_the_pipeline_config_carries_the_benchmarks_size(pc, tmp_path):
    class Bench:
        private, M, path = "nm", 9, pc.Path(pc.state_zip("nm"))

    base = yaml.safe_load(pc.DEFAULT_CONFIG.read_text())
    cfg = yaml.safe_load(pc.pipeline_config(base, Bench(), ["nh"], "dprelease", 2.0, 1e-9, tmp_path).read_text())
    assert cfg["household_rules"] == {"max_household_size": 9, "group_quarters": "single_person_households", "oversize": "clip"}
    assert cfg["privacy_unit"] == "household" and cfg["synthesizer"] == "prior_update"
    assert cfg["private"] == [{"path": "acs2018_1yr/csv_pnm.zip"}]
    Bench.path = tmp_path / "csv_pnm_race60.zip"  # --private-file: that file in place of the shared one
    cfg = yaml.safe_load(pc.pipeline_config(base, Bench(), ["nh"], "dprelease", 2.0, 1e-9, tmp_path).read_text())
    assert cfg["private"] == [{"path": str(tmp_path / "csv_pnm_race60.zip")}]


def test_a_size_below_the_scored_top_code_is_refused(pc, capsys):
    with pytest.raises(SystemExit):
        pc.main(["--max-household-size", "6", "--methods", "dprelease"])
    assert "must be ≥ 7" in capsys.readouterr().err


def test_the_error_by_attribute_averages_the_marginals_that_hold_it(pc):
    import itertools

    import numpy as np

    triples = list(itertools.combinations(range(len(pc.ATTRS)), 3))
    hisp = pc.ATTRS.index("HISP_ORIGIN")
    l1 = [1.0 if hisp in t else 0.1 for t in triples]  # every marginal with Hispanic origin is off
    by = pc.l1_by_attribute(triples, l1)
    assert list(by) == list(pc.ATTRS)
    assert by["HISP_ORIGIN"] == 1.0 and max(by, key=by.get) == "HISP_ORIGIN"
    # any other attribute: 9 of its 45 triples also hold Hispanic origin
    assert np.isclose(by["SEX"], (9 * 1.0 + 36 * 0.1) / 45)
    assert pc.l1_by_attribute([(0, 1, 2)], [0.5]) == {pc.ATTRS[0]: 0.5, pc.ATTRS[1]: 0.5, pc.ATTRS[2]: 0.5}


def test_the_tables_breakdown_averages_each_methods_runs_at_one_epsilon(pc):
    rec = lambda m, e, v: {"method": m, "epsilon": e, "metrics": {"l1_by_attribute": {"SEX": v, "CIT": 2 * v}}}  # noqa: E731
    records = [rec("aim", 2.0, 0.1), rec("aim", 2.0, 0.3), rec("aim", 1.0, 9.0), rec("dprelease", 2.0, 0.5),
               {"method": "mst", "epsilon": 2.0, "error": "failed"}]
    assert pc.breakdown(records, ["aim", "mst", "dprelease"], "2.0", "l1_by_attribute", ("SEX", "CIT")) == [
        "aim 0.200 / 0.400", "dprelease 0.500 / 1.000"]
