"""Inputs are independent before anything is read beyond their identity: the same file listed
twice, one content under two names, and a public file covering a private state in a shared survey
year are refused (exit 2, one line naming both inputs, nothing written); other states and other
survey years of the same state pass."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
import yaml

from flows.cli import main
from schemas.input_independence import Coverage, InputsNotIndependent, check_inputs, sha256_file
from schemas.release_config import load_config
from tests.conftest import ACS2013_DE, ACS2018, PROJECT_ROOT

LEGACY_CONFIG = PROJECT_ROOT / "deploy" / "releases" / "de_2018_from_2013.yaml"


def _config(tmp_path: Path, private: list[dict], public: list[dict], **over) -> Path:
    cfg = {
        "name": "independence",
        "data_root": str(ACS2018.parent),
        "private": private,
        "public": public,
        "budget": {"epsilon": 1.0, "delta": 1e-10},
        "advanced": {"allocation": {
            "stages": {"count_of_counts": 0.1, "state_synthesis": 0.45, "puma_synthesis": 0.45}, "synthesis_split": "fixed",
            "levels": {"count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5}, "state_synthesis": {"state": 1.0},
                       "puma_synthesis": {"puma": 1.0}},
        }},
        "output_dir": str(tmp_path / "releases"),
        "work_dir": str(tmp_path / "work"),
        **over,
    }
    p = tmp_path / "release.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def _vermont_extract(path: Path, year: str | None = None, n: int = 40) -> str:
    """The first ``n`` person records of Vermont 2018 as a CSV; ``year``: their SERIALNO year
    prefix replaced (another survey year of the same state)."""
    with zipfile.ZipFile(ACS2018 / "csv_pvt.zip") as z:
        lines = z.open("psam_p50.csv").read().decode().splitlines()[: n + 1]
    if year is not None:
        lines = lines[:1] + [line.replace(",2018", f",{year}", 1) for line in lines[1:]]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _refusal(tmp_path: Path, cfg: Path, capsys) -> str:
    """Run ``dprelease run`` and ``dprelease plan`` on ``cfg``: both exit 2 with one ``error:``
    line, and neither the work nor the release directory exists; the line."""
    for command in ("run", "plan"):
        assert main([command, str(cfg)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not (tmp_path / "work").exists() and not (tmp_path / "releases").exists()
    return err


def test_the_same_file_listed_twice_is_refused(tmp_path, capsys, data_root):
    vt = {"path": "acs2018_1yr/csv_pvt.zip"}
    err = _refusal(tmp_path, _config(tmp_path, [vt], [{"path": str(ACS2018 / "csv_pvt.zip")}]), capsys)
    assert "private.0.path and public.0.path are the same file" in err and "csv_pvt.zip" in err
    err = _refusal(tmp_path, _config(tmp_path, [vt, vt], [{"path": "acs2018_1yr/csv_pnh.zip"}]), capsys)
    assert "private.0.path and private.1.path are the same file" in err


def test_the_same_content_under_another_name_is_refused_without_its_hash(tmp_path, capsys, data_root):
    copy = tmp_path / "data" / "vermont.zip"
    copy.parent.mkdir()
    shutil.copyfile(ACS2018 / "csv_pvt.zip", copy)
    err = _refusal(tmp_path, _config(tmp_path, [{"path": "acs2018_1yr/csv_pvt.zip"}], [{"path": str(copy)}]), capsys)
    assert "private.0.path" in err and "public.0.path" in err and "same content" in err
    assert sha256_file(copy) not in err and sha256_file(copy)[:12] not in err


def test_a_housing_file_shared_by_a_private_and_a_public_input_is_refused(tmp_path, capsys, data_root):
    persons = tmp_path / "data" / "ss13pxx.csv"
    persons.parent.mkdir()
    persons.write_text((ACS2013_DE / "ss13pde.csv").read_text().replace("\n", "\r\n"))  # other bytes, other name
    housing = str(ACS2013_DE / "ss13hde.csv")
    cfg = _config(tmp_path, [{"path": str(ACS2013_DE / "ss13pde.csv"), "layout": "pums_legacy", "housing": housing}],
                  [{"path": str(persons), "layout": "pums_legacy", "housing": housing}], domain="acs_pums_core")
    err = _refusal(tmp_path, cfg, capsys)
    assert "private.0.housing and public.0.housing are the same file" in err and "ss13hde.csv" in err


def test_a_public_file_covering_a_private_state_in_its_survey_year_is_refused(tmp_path, capsys, data_root):
    public = _vermont_extract(tmp_path / "vt_extract.csv")
    err = _refusal(tmp_path, _config(tmp_path, [{"path": "acs2018_1yr/csv_pvt.zip"}], [{"path": public}]), capsys)
    assert "public.0.path" in err and "covers state 50 of private.0.path" in err and "survey year 2018" in err


def test_other_states_and_other_survey_years_of_a_private_state_pass(tmp_path, capsys, data_root):
    """The negative controls: the checks refuse only what they name. Another state, the same state
    in another survey year (2017+ layout: its SERIALNO years; the shipped 2013 → 2018 Delaware
    pair: a pre-2017 file), and a five-year-like file only once it holds a record of the private year."""
    vt = [{"path": "acs2018_1yr/csv_pvt.zip"}]
    assert len(check_inputs(load_config(_config(tmp_path, vt, [{"path": "acs2018_1yr/csv_pnh.zip"}])))) == 2
    earlier = _vermont_extract(tmp_path / "vt_2017.csv", year="2017")
    assert len(check_inputs(load_config(_config(tmp_path, vt, [{"path": earlier}])))) == 2
    assert len(check_inputs(load_config(LEGACY_CONFIG))) == 3  # private person file; public person and housing files
    mixed = Path(earlier).read_text().splitlines()
    mixed[-1] = mixed[-1].replace(",2017", ",2018", 1)
    Path(earlier).write_text("\n".join(mixed) + "\n")
    with pytest.raises(InputsNotIndependent, match="covers state 50 of private.0.path .* in survey year 2018"):
        check_inputs(load_config(_config(tmp_path, vt, [{"path": earlier}])))
    # plan says how many files it checked (those missing here are not)
    assert main(["plan", str(_config(tmp_path, vt, [{"path": "acs2018_1yr/csv_pnh.zip"}, {"path": str(tmp_path / "absent.zip")}]))]) == 0
    assert "inputs: 2 of 3 files checked for independence" in capsys.readouterr().out


@pytest.mark.parametrize(("a", "b", "shared"), [
    ({2018}, {2018}, True), ({2018}, {2017}, False), ({2014, 2015, 2016, 2017, 2018}, {2018}, True),
    (None, {2018}, False), (None, {2016, 2017}, True), (None, None, True),
])
def test_survey_years_are_shared_where_they_may_overlap(a, b, shared):
    """Pre-2017 files (years None) predate every 2017+ layout year; two of them cannot be told apart."""
    ca = Coverage(frozenset({10}), None if a is None else frozenset(a))
    cb = Coverage(frozenset({10}), None if b is None else frozenset(b))
    assert ca.shares_years(cb) is shared and cb.shares_years(ca) is shared


def test_the_library_path_refuses_before_writing(tmp_path, data_root):
    """``release_flow`` called as a library (no CLI pre-flight) refuses in the same way before its work directory exists."""
    from flows.release import release_flow

    cfg = _config(tmp_path, [{"path": "acs2018_1yr/csv_pvt.zip"}], [{"path": "acs2018_1yr/csv_pvt.zip"}])
    with pytest.raises(InputsNotIndependent, match="same file"):
        release_flow.fn(str(cfg))
    assert not (tmp_path / "work").exists()
