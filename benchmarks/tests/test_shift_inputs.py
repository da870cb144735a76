"""benchmarks/shift_inputs.py on a slice of Vermont: the shifts are deterministic, touch the target
share of units, rewrite only their own columns (every other byte kept) and give files the
project's reader takes."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, load_benchmark

TOLERANCE = 0.08  # on a share of ~400 units: over three binomial standard deviations


@pytest.fixture(scope="module")
def si():
    return load_benchmark("shift_inputs")


@pytest.fixture(scope="module")
def source(si, data_root, tmp_path_factory) -> Path:
    """Every eighth unit (SERIALNO) of Vermont, housing units and group quarters, in the
    shared file's layout."""
    member, df = si.read_source(data_root / "acs2018_1yr" / "csv_pvt.zip")
    keep = np.unique(df["SERIALNO"].to_numpy())[::8]
    path = tmp_path_factory.mktemp("vt") / "csv_pvt.zip"
    si.write_zip(df[df["SERIALNO"].isin(keep)], member, path)
    return path


@pytest.fixture(scope="module")
def built(si, source, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("shifts")
    return out, si.build(source, out, list(si.SHIFTS), "vt")


def rows(path: Path) -> list[list[bytes]]:
    """The CSV's fields as bytes, header first (PUMS files have no quoted fields)."""
    with zipfile.ZipFile(path) as z:
        (member,) = z.namelist()
        return [line.split(b",") for line in z.read(member).splitlines()]


def frame(path: Path) -> pd.DataFrame:
    with zipfile.ZipFile(path) as z:
        (member,) = z.namelist()
        return pd.read_csv(io.BytesIO(z.read(member)), dtype=str, keep_default_na=False)


def test_a_rerun_writes_the_same_bytes(si, source, built, tmp_path):
    """The rerun is another process (its own hash seed, a later clock), through the command line."""
    out, _ = built
    script = ROOT / "benchmarks" / "shift_inputs.py"
    done = subprocess.run([sys.executable, str(script), "--state", "vt", "--data", str(source.parent), "--out", str(tmp_path)],
                          capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "random"})
    assert done.returncode == 0, done.stderr
    for shift in si.SHIFTS:
        name = f"csv_pvt_{shift}.zip"
        assert (out / name).read_bytes() == (tmp_path / name).read_bytes(), shift


@pytest.mark.parametrize("shift", ["race60", "age", "citizenship", "race60+age"])
def test_an_attribute_shift_rewrites_its_columns_in_the_selected_units_only(si, source, built, shift):
    out, summary = built
    before, after = rows(source), rows(out / f"csv_pvt_{shift}.zip")
    assert len(before) == len(after) and before[0] == after[0]
    header = [c.decode() for c in before[0]]
    b, a = np.array(before[1:], dtype=object), np.array(after[1:], dtype=object)
    steps = si.SHIFTS[shift]
    own = [header.index(c) for t in steps for c in si.CHANGED[t]]
    others = [i for i in range(len(header)) if i not in own]
    assert (b[:, others] == a[:, others]).all()  # every other byte kept
    serial = np.array([s.decode() for s in b[:, header.index("SERIALNO")]])
    for t in steps:
        (column,) = si.CHANGED[t]
        i = header.index(column)
        pick = si.selected(t, serial, si.SHARE)
        old = np.array([v.decode() for v in b[:, i]])
        new = np.array([v.decode() for v in a[:, i]])
        assert (old[~pick] == new[~pick]).all()
        if column == "AGEP":
            expected = np.minimum(old[pick].astype(int) + si.AGE_STEP, si.AGE_TOP).astype(str)
        else:
            mapping = si.RACE_CYCLE if column == "RAC1P" else si.CIT_CYCLE
            expected = np.array([mapping.get(v, v) for v in old[pick]])
        assert (new[pick] == expected).all(), column
        units = pd.Series(pick).groupby(serial).first()
        assert abs(units.mean() - si.SHARE) < TOLERANCE
        assert abs(summary[shift][f"units_changed_share_{column}"] - si.SHARE) < TOLERANCE


def test_two_shifts_at_once_are_the_one_after_the_other(si, source, built, tmp_path):
    out, _ = built
    si.build(out / "csv_pvt_race60.zip", tmp_path, ["age"], "vt")
    assert (tmp_path / "csv_pvt_age.zip").read_bytes() == (out / "csv_pvt_race60+age.zip").read_bytes()


def test_the_size_shift_removes_the_last_person_of_half_the_multi_person_households(si, source, built):
    out, summary = built
    before, after = frame(source), frame(out / "csv_pvt_size.zip")
    key = ["SERIALNO", "SPORDER"]
    kept = before.reset_index().merge(after[key], on=key)["index"].to_numpy()
    assert len(kept) == len(after) and (np.diff(kept) > 0).all()  # a subset of the persons, in order
    old, new = rows(source), rows(out / "csv_pvt_size.zip")
    assert new[0] == old[0] and new[1:] == [old[1 + i] for i in kept]  # each kept byte for byte
    dropped = before.drop(index=kept)
    size = before.groupby("SERIALNO").size()
    assert dropped["SERIALNO"].is_unique  # one person at most per household
    assert (size.loc[dropped["SERIALNO"]] > 1).all() and dropped["SERIALNO"].str.slice(4, 6).eq("HU").all()
    last = before.groupby("SERIALNO")["SPORDER"].apply(lambda s: s.astype(int).max())
    assert (dropped["SPORDER"].astype(int).to_numpy() == last.loc[dropped["SERIALNO"]].to_numpy()).all()
    assert (dropped["RELP"] != "00").all()
    multi = size[(size > 1) & (size.index.str.slice(4, 6) == "HU")].index
    share = multi.isin(dropped["SERIALNO"]).mean()
    assert abs(share - si.SIZE_SHARE) < TOLERANCE and summary["size"]["units_changed_share"] == round(share, 4)
    assert (multi.isin(dropped["SERIALNO"]) == si.selected("size", multi.to_numpy(), si.SIZE_SHARE)).all()


def test_the_size_shift_refuses_to_remove_a_householder(si):
    candidates = np.array([f"2018HU{k:07d}" for k in range(1, 100)])
    serial = candidates[si.selected("size", candidates, si.SIZE_SHARE)][0]  # a unit the shift touches
    unit = pd.DataFrame({"SERIALNO": [serial] * 2, "SPORDER": ["01", "02"], "RELP": ["01", "00"]})
    with pytest.raises(ValueError, match="householder"):
        si.shift_size(unit, "size")
    assert len(si.shift_size(unit.assign(RELP=["00", "01"]), "size")) == 1  # the householder first: one person fewer


def test_every_shifted_file_reads_back_through_the_project_reader(si, built):
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file

    out, summary = built
    for shift in si.SHIFTS:
        path = out / f"csv_pvt_{shift}.zip"
        data, report = load_person_file(path, load_domain_spec(), HouseholdRules())
        assert report["persons_read"] == len(frame(path)) == summary[shift]["reader_persons_read"] and data.n_persons > 0


def test_it_refuses_to_write_inside_the_repository(si):
    with pytest.raises(SystemExit):
        si.main(["--state", "vt", "--out", str(ROOT / "generated")])
