"""The peer benchmark's set-up that needs no peer (runs without the ``bench`` extra): the pipeline
side clips households as the release config it measures does."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from conftest import load_benchmark


@pytest.fixture(scope="module")
def pc():
    return load_benchmark("peer_comparison")


def test_households_are_clipped_at_the_base_configs_size(pc):
    shipped = yaml.safe_load(pc.DEFAULT_CONFIG.read_text())
    assert pc.household_max_size(shipped) == 8  # the shipped config keeps the schema's default
    assert pc.household_max_size({**shipped, "household_rules": {"max_household_size": 11}}) == 11


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


def _checkout(root, config: dict):
    (root / "flows").mkdir(parents=True)
    (root / "flows" / "cli.py").write_text("")
    (root / "deploy" / "releases").mkdir(parents=True)
    (root / "deploy" / "releases" / "acs2018_default.yaml").write_text(yaml.safe_dump(config))
    return root


def test_a_source_is_a_named_checkout_of_the_repository(pc, tmp_path):
    before = _checkout(tmp_path / "before", {"name": "x"})
    assert pc.parse_sources([f"before={before}", f"after={pc.ROOT}"]) == {"before": before, "after": pc.ROOT}
    for bad, why in ((f"{before}", "NAME=PATH"), (f"=={before}", "NAME=PATH"), (f"a b={before}", "NAME=PATH"),
                     (f"x={tmp_path}", "not a checkout"), (f"b={before}", "given twice")):
        with pytest.raises(ValueError, match=why):
            pc.parse_sources([bad, f"b={before}"] if why == "given twice" else [bad])


def test_a_source_method_needs_its_source(pc, capsys):
    with pytest.raises(SystemExit):
        pc.main(["--methods", "dprelease@before", "--source", f"after={pc.ROOT}"])
    assert "needs --source NAME=PATH" in capsys.readouterr().err


def test_each_source_runs_with_its_own_base_config_and_resume_keeps_it(pc, tmp_path):
    before = _checkout(tmp_path / "before", {"name": "old", "allocation": {"stages": {"a": 1.0}}})
    subprocess.run(["git", "init", "-q"], cwd=before, check=True)
    sources = pc.source_configs({"before": before}, None)
    assert sources["before"]["base_config"]["allocation"] == {"stages": {"a": 1.0}}
    assert sources["before"]["path"] == str(before)
    # a later invocation (--resume) keeps the kept records' config, and their sources it is not given again
    (before / "deploy" / "releases" / "acs2018_default.yaml").write_text(yaml.safe_dump({"name": "changed"}))
    old = {"settings": {"sources": {**sources, "gone": {**sources["before"], "path": "/elsewhere"}}}}
    kept = pc.source_configs({"before": before}, old)
    assert kept["before"]["base_config"]["allocation"] == {"stages": {"a": 1.0}}
    assert kept["gone"]["path"] == "/elsewhere"
    assert pc.source_configs({"before": before}, None)["before"]["base_config"] == {"name": "changed"}


def test_the_benchmark_sets_only_the_keys_every_config_format_knows(pc, tmp_path):
    class Bench:
        private, M, path = "nh", 8, pc.Path(pc.state_zip("nh"))

    shipped = yaml.safe_load(pc.DEFAULT_CONFIG.read_text())
    older = {**shipped, "allocation": {"stages": {"state_synthesis": 1.0}}, "synthesis": {"sampling": "balanced"}}  # an older format's sections
    root = tmp_path / "tree"
    cfg = yaml.safe_load(pc.pipeline_config(older, Bench(), ["vt"], "dprelease", 1.0, 1e-9, tmp_path, root).read_text())
    assert set(cfg) == set(older) | set(pc.SHARED_KEYS)
    assert {k for k in cfg if cfg[k] != older.get(k)} <= set(pc.SHARED_KEYS)  # the tree's own sections as they are
    assert cfg["budget"] == {"epsilon": 1.0, "delta": 1e-9, "conversion": "cks"}
    assert cfg["private"] == [{"path": "acs2018_1yr/csv_pnh.zip"}] and cfg["public"] == [{"path": "acs2018_1yr/csv_pvt.zip"}]
    assert cfg["domain"] == str(root / "schemas" / "domains" / "acs_pums_aim.yaml")  # the tree's own spec
    # the run's release and work go to its temporary directory, never into the checkout
    assert cfg["output_dir"] == str(tmp_path / "releases") and cfg["work_dir"] == str(tmp_path / "work")
    public = yaml.safe_load(pc.pipeline_config(shipped, Bench(), ["vt"], "public", 1.0, 1e-9, tmp_path).read_text())
    assert public["synthesizer"] == "public_baseline"


def test_the_ratio_against_the_better_peer_takes_the_lower_error(pc):
    cell = lambda v: {"mean_l1": {"mean": v}}  # noqa: E731
    assert pc.better_ratio(cell(0.1), cell(0.2), cell(0.4)) == pytest.approx(0.5)
    assert pc.better_ratio(cell(0.1), cell(0.4), cell(0.05)) == pytest.approx(2.0)
