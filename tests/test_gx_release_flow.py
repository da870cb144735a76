"""The Great Expectations gates in a real run (Prefect + a local Dask cluster): the release ships
its GX result (success, hashed, verified), the input suite's value-free result stays in the work
directory, the QA report links the Data Docs; a run whose synthetic table is broken exits
non-zero naming the failed expectation and publishes nothing. Marked ``flow``."""

from __future__ import annotations

import json

import pytest
import yaml

pytestmark = pytest.mark.flow


def _config(tmp_path, data_root, name: str):
    cfg = {
        "name": name,
        "data_root": str(data_root),
        "private": [{"path": "acs2018_1yr/csv_pvt.zip"}],
        "public": [{"path": "acs2018_1yr/csv_pnh.zip"}],
        "budget": {"epsilon": 1.0, "delta": 1e-10},
        "advanced": {"allocation": {"stages": {"count_of_counts": 1.0}, "levels": {"count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5}}}},
        "synthesizer": "public_baseline",
        "sampling_seed": 16,
        "output_dir": str(tmp_path / "releases"),
        "work_dir": str(tmp_path / "work"),
    }
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_release_ships_the_gx_result_and_a_broken_table_is_refused(tmp_path, data_root, capsys, monkeypatch):
    from flows.cli import main

    assert main(["run", str(_config(tmp_path, data_root, "gx"))]) == 0
    rel, work = tmp_path / "releases" / "gx", tmp_path / "work" / "gx"
    result = json.loads((rel / "validation" / "gx_release.json").read_text())
    assert result["success"] is True and set(result["checkpoints"]) == {"households", "persons", "count_of_counts"}
    manifest = json.loads((rel / "manifest.json").read_text())
    assert "validation/gx_release.json" in manifest["outputs"] and manifest["validation"]["result"] == "validation/gx_release.json"
    assert manifest["libraries"]["great-expectations"].startswith("1.24")
    assert main(["audit", "verify", str(rel)]) == 0
    assert json.loads((work / "gx_inputs.json").read_text())["success"] is True
    assert (work / "qa" / "gx_data_docs" / "index.html").exists()
    assert "gx_data_docs/index.html" in (work / "qa" / "report.md").read_text()
    assert "gx_data_docs/index.html" in (work / "qa" / "report.html").read_text()
    capsys.readouterr()

    # the same run with one synthetic person row lost on the way to publishing
    import tasks.publish as publish

    real = publish.to_tables
    monkeypatch.setattr(publish, "to_tables", lambda data: (lambda hh, pp: (hh, pp.slice(1)))(*real(data)))
    assert main(["run", str(_config(tmp_path, data_root, "gx-broken"))]) == 2
    err = capsys.readouterr().err
    assert "release gate (Great Expectations) refused to publish" in err
    assert "households: expect_column_pair_values_to_be_equal(column_A=NP, column_B=persons_in_household)" in err
    assert not (tmp_path / "releases" / "gx-broken").exists()
    assert [p.name for p in (tmp_path / "releases").iterdir()] == ["gx"]
