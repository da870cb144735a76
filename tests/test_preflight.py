"""Everything a run would refuse without reading a record is refused before Prefect starts, by
``dprelease run`` and by ``dprelease plan`` alike: one ``error:`` line, exit 2, nothing written."""

from __future__ import annotations

import pytest
import yaml

from flows import cli

BASE = {
    "name": "pre",
    "private": [{"path": "acs2018_1yr/csv_pvt.zip"}],
    "public": [{"path": "acs2018_1yr/csv_pnh.zip"}, {"path": "acs2018_1yr/csv_pme.zip"}],
    "budget": {"epsilon": 1.0},
}

CASES = {
    "release exists": ({}, "exists already; a finished release is never overwritten"),
    "domain missing": ({"domain": "/nonexistent/domain.yaml"}, "/nonexistent/domain.yaml: cannot read the domain spec"),
    "unknown attribute": ({"attributes": {"person": ["SEX", "FOO"]}}, "attributes: no person attribute 'FOO'"),
    "flip of the relationship": ({"advanced": {"synthesis": {"prior_flips": ["RELP_GROUP"]}}},
                                 "advanced.synthesis.prior_flips: RELP_GROUP is the relationship"),
    "flip of a household attribute": ({"advanced": {"synthesis": {"prior_flips": ["TEN"]}}}, "advanced.synthesis.prior_flips: 'TEN' is not a person attribute of the domain"),
    "default split on one public state": ({"public": [{"path": "acs2018_1yr/csv_pnh.zip"}]},
                                  "needs public inputs of at least two states (they cover 1)"),
    "missing input": ({"private": [{"path": "acs2018_1yr/csv_pxx.zip"}]}, "file not found (private.0.path)"),
}


def _config(tmp_path, data_root, over: dict):
    cfg = {**BASE, "data_root": str(data_root), "output_dir": str(tmp_path / "releases"), "work_dir": str(tmp_path / "work"), **over}
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


@pytest.mark.parametrize("case", list(CASES))
def test_refused_before_prefect_starts_by_run_and_by_plan(case, tmp_path, data_root, capsys, monkeypatch):
    over, expected = CASES[case]
    cfg = _config(tmp_path, data_root, over)
    if case == "release exists":
        (tmp_path / "releases" / "pre").mkdir(parents=True)
    import flows.local_api

    def no_prefect(*a, **k):
        raise AssertionError("Prefect was started for a refusal that needs no data")

    monkeypatch.setattr(flows.local_api.LocalPrefectApi, "start", no_prefect)
    for command in ("run", "plan") if case != "missing input" else ("run",):  # plan runs where the data are not
        assert cli.main([command, str(cfg)]) == 2, (case, command)
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and expected in err, (case, command, err)
    assert not (tmp_path / "work").exists()  # nothing written
    assert (tmp_path / "releases").exists() == (case == "release exists")


def test_a_valid_config_passes_and_plan_prints_it(tmp_path, data_root, capsys):
    cfg = _config(tmp_path, data_root, {})
    assert cli.main(["plan", str(cfg)]) == 0
    assert "inputs: 3 of 3 files checked for independence" in capsys.readouterr().out


def test_a_resumed_run_says_how_far_the_earlier_one_got(tmp_path):
    from tasks.audit import AuditLog

    run_dir = tmp_path / "work" / "r"
    run_dir.mkdir(parents=True)
    assert cli.resume_note(run_dir) is None
    log = AuditLog(run_dir / "audit.jsonl")
    log.append("run_start", release="r")
    for stage in ("ingest", "select_workload"):
        log.append("stage_start", stage=stage)
        log.append("stage_end", stage=stage)
    log.append("stage_start", stage="count_of_counts")
    note = cli.resume_note(run_dir)
    assert note is not None and note.startswith(f"resuming release r from {run_dir} (run 2)")
    assert "stages finished before: ingest, select_workload; stopped in count_of_counts" in note


def test_the_new_year_recipe_followed_literally_plans(tmp_path, data_root, capsys):
    """docs/configuration.md's recipe on the shipped 2013 → 2018 config: a new name, the new year's
    file private, a 2017+ file public with its layout and housing removed, the full domain. The
    shared data hold no second 2017+ year of Delaware, so another state's 2018 file stands in for it."""
    from tests.conftest import PROJECT_ROOT

    raw = yaml.safe_load((PROJECT_ROOT / "deploy" / "releases" / "de_2018_from_2013.yaml").read_text())
    raw["name"] = "de-next-year"
    raw["private"] = [{"path": "acs2018_1yr/csv_pde.zip"}]
    raw["public"] = [{k: v for k, v in {**raw["public"][0], "path": "acs2018_1yr/csv_pvt.zip"}.items() if k not in ("layout", "housing")}]
    raw["domain"] = "acs_pums"
    raw.update(data_root=str(data_root), output_dir=str(tmp_path / "releases"), work_dir=str(tmp_path / "work"))
    cfg = tmp_path / "next.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    assert cli.main(["plan", str(cfg)]) == 0
    assert "release de-next-year" in capsys.readouterr().out
