"""Shifted private inputs: a shared 2018 state's person file made unlike every public state.

Each shift is a deterministic transformation of one shared person file (``csv_pXX.zip``) that
moves its population away from every one of the twelve shared states in a way a binary flip of
one attribute cannot express. The households (units: a housing unit, or a group-quarters person,
each one SERIALNO) a shift touches are chosen by a keyed hash, the first 8 bytes of
``sha256("<transformation>:<SERIALNO>")`` read as a fraction of 2⁶⁴ below the share, so a rerun
writes the same bytes and anyone can recompute the selection from the file alone:

  race60       RAC1P permuted for every person of 60 % of the units, by the cycle
               1 → 2 → 6 → 9 → 1 (White alone → Black alone → Asian alone → two or more races →
               White alone; 3, 4, 5, 7, 8 unchanged): the most common code goes to one that is rare
               in every shared state, so the state becomes majority Black alone.
  age          AGEP + 15 years, capped at 99, for every person of 60 % of the units: every person
               under 75 leaves the age band (of the AIM domain's nine) they were in. Only AGEP
               moves: the age-dependent universes (SCHL blank under 3, ESR blank under 16) are
               left as they were, so the shifted units also hold combinations no survey holds.
  citizenship  CIT permuted for every person of 60 % of the units, by the cycle 1 → 4 → 5 → 1
               (born in the US → naturalised citizen → not a citizen → born in the US; 2 and 3
               unchanged): a state of mostly foreign-born persons.
  size         in 50 % of the multi-person housing units, the person with the highest SPORDER
               (the last non-householder: the householder is person 1) is removed, so every
               selected household is one person smaller; SPORDER stays 1..k and the householder
               (RELP 00) stays, so the file is valid for the reader.
  race60+age   race60 and then age, each with its own selection (the file is exactly the age
               shift applied to the race60 file).

Every other column, and every column of a shift's other persons, keeps its bytes; the rows keep
their order. A shifted file is written as ``<out>/csv_p<xx>_<shift>.zip`` (the source's member
name, ``psam_pNN.csv``: the same PUMS layout) and read back through the project's reader
(``schemas.ingestion.load_person_file``, default domain) before it counts as written. Beside each
file goes a release config, ``<xx>_<shift>.yaml``: the default release config with the shifted
file as the only private input and the eleven other shared 2018 states as public. The files are
copies of the shared data: write them outside the repository and never commit them.

    python benchmarks/shift_inputs.py --state nh --out /tmp/shifts            # all five shifts
    python benchmarks/shift_inputs.py --state nh --out /tmp/shifts --shifts race60,size
    python -m flows.cli run /tmp/shifts/nh_race60.yaml                       # the pipeline on one
    python benchmarks/peer_comparison.py --private nh --private-file /tmp/shifts/csv_pnh_race60.zip \\
        --epsilons 0.25,1 --methods aim,dprelease,public                    # peers on one

The summary printed (and written to ``<out>/shifts.json``) gives, per shift, the share of units
changed (of the units eligible: all units, or the multi-person housing units for ``size``) and the
one-way distribution of each shifted attribute before and after (benchmark output, internal).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas.domain_spec import load_domain_spec  # noqa: E402
from schemas.ingestion import HouseholdRules, load_person_file  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "acs2018_1yr"
STATES = ("de", "id", "me", "mt", "nd", "ne", "nh", "nm", "ri", "sd", "vt", "wy")
SHARE = 0.6  # of the units, for the attribute shifts
SIZE_SHARE = 0.5  # of the multi-person housing units
RACE_CYCLE = {"1": "2", "2": "6", "6": "9", "9": "1"}
CIT_CYCLE = {"1": "4", "4": "5", "5": "1"}
AGE_STEP, AGE_TOP = 15, 99
AGE_BANDS = (0, 5, 18, 25, 35, 45, 55, 65, 75)  # lower bounds of the AIM domain's bands
ZIP_TIME = (1980, 1, 1, 0, 0, 0)  # a fixed member time stamp: the archive's bytes depend on the data only


def selected(transformation: str, serials: np.ndarray, share: float) -> np.ndarray:
    """Whether each SERIALNO is among the ``share`` of units a transformation touches. The hash is
    SHA-256 so that the choice is defined outside any library; it is computed once per unit."""
    unique, inverse = np.unique(serials, return_inverse=True)
    key = transformation.encode() + b":"
    u = np.fromiter((int.from_bytes(hashlib.sha256(key + s.encode()).digest()[:8], "big") for s in unique),
                    dtype=np.float64, count=unique.size) / 2.0**64
    return (u < share)[inverse]


def _relabel(column: str, mapping: dict[str, str]) -> Callable[[pd.DataFrame, str], pd.DataFrame]:
    def shift(df: pd.DataFrame, name: str) -> pd.DataFrame:
        pick = selected(name, df["SERIALNO"].to_numpy(), SHARE)
        out = df.copy()
        old = df.loc[pick, column]
        out.loc[pick, column] = old.map(mapping).fillna(old)  # simultaneous: a code moves once
        return out
    return shift


def shift_age(df: pd.DataFrame, name: str) -> pd.DataFrame:
    pick = selected(name, df["SERIALNO"].to_numpy(), SHARE)
    out = df.copy()
    out.loc[pick, "AGEP"] = np.minimum(df.loc[pick, "AGEP"].astype(np.int64) + AGE_STEP, AGE_TOP).astype(str)
    return out


def shift_size(df: pd.DataFrame, name: str) -> pd.DataFrame:
    serial = df["SERIALNO"]
    housing_unit = serial.str.slice(4, 6).eq("HU").to_numpy()
    persons = serial.map(serial.value_counts()).to_numpy()
    eligible = housing_unit & (persons > 1)
    order = df["SPORDER"].astype(np.int64)
    last = (order == order.groupby(serial).transform("max")).to_numpy()
    drop = eligible & last & selected(name, serial.to_numpy(), SIZE_SHARE)
    if (df["RELP"].to_numpy()[drop] == "00").any():
        raise ValueError("a householder is the last person of a household: the size shift would leave it headless")
    return df.loc[~drop]


TRANSFORMATIONS: dict[str, Callable[[pd.DataFrame, str], pd.DataFrame]] = {
    "race60": _relabel("RAC1P", RACE_CYCLE),
    "age": shift_age,
    "citizenship": _relabel("CIT", CIT_CYCLE),
    "size": shift_size,
}
SHIFTS: dict[str, tuple[str, ...]] = {"race60": ("race60",), "age": ("age",), "citizenship": ("citizenship",),
                                      "size": ("size",), "race60+age": ("race60", "age")}
CHANGED = {"race60": ("RAC1P",), "age": ("AGEP",), "citizenship": ("CIT",), "size": ()}  # columns each rewrites


def read_source(path: Path) -> tuple[str, pd.DataFrame]:
    """(person member name, every column as the strings of the file)."""
    with zipfile.ZipFile(path) as z:
        member = next(m for m in z.namelist() if m.startswith("psam_p") and m.endswith(".csv"))
        with z.open(member) as f:
            return member, pd.read_csv(f, dtype=str, keep_default_na=False)


def apply(df: pd.DataFrame, shift: str) -> pd.DataFrame:
    for t in SHIFTS[shift]:
        df = TRANSFORMATIONS[t](df, t)
    return df


def write_zip(df: pd.DataFrame, member: str, path: Path) -> None:
    info = zipfile.ZipInfo(member, date_time=ZIP_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(info, df.to_csv(index=False, lineterminator="\n"))


def shares(values: pd.Series) -> dict[str, float]:
    return {str(k): round(float(v), 4) for k, v in values.value_counts(normalize=True).sort_index().items()}


def age_bands(agep: pd.Series) -> pd.Series:
    bands = np.searchsorted(np.array(AGE_BANDS), agep.astype(np.int64).to_numpy(), side="right") - 1
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(AGE_BANDS, AGE_BANDS[1:])] + [f"{AGE_BANDS[-1]}+"]
    return pd.Series(pd.Categorical.from_codes(bands, labels))  # categories keep the bands' order


def sizes(df: pd.DataFrame) -> pd.Series:
    hu = df[df["SERIALNO"].str.slice(4, 6).eq("HU")]
    return hu.groupby("SERIALNO").size().clip(upper=7).astype(str).str.replace("7", "7+")


def describe(before: pd.DataFrame, after: pd.DataFrame, shift: str) -> dict:
    """Share of units changed and the one-way distribution of each shifted attribute."""
    out: dict = {"persons": [len(before), len(after)]}
    if "size" in SHIFTS[shift]:
        eligible = sizes(before).index[sizes(before).astype(str) != "1"]
        kept = after.groupby("SERIALNO").size()
        lost = before.groupby("SERIALNO").size().loc[eligible] - kept.reindex(eligible, fill_value=0)
        out["units_changed_share"] = round(float((lost > 0).mean()), 4)
        out["units_eligible"] = "multi-person housing units"
        out["NP (housing units)"] = {"before": shares(sizes(before)), "after": shares(sizes(after))}
        return out
    cols = [c for t in SHIFTS[shift] for c in CHANGED[t]]
    diff = (before[cols].to_numpy() != after[cols].to_numpy()).any(axis=1)
    by_unit = before["SERIALNO"].to_numpy()
    out["units_changed_share"] = round(float(pd.Series(diff).groupby(by_unit).any().mean()), 4)
    out["units_eligible"] = "all units"
    for c in cols:
        out[f"units_changed_share_{c}"] = round(float(pd.Series(before[c].to_numpy() != after[c].to_numpy()).groupby(by_unit).any().mean()), 4)
        view = age_bands if c == "AGEP" else (lambda s: s)
        out["AGEP_BAND" if c == "AGEP" else c] = {"before": shares(view(before[c])), "after": shares(view(after[c]))}
    return out


def release_config(shifted: Path, state: str, data: Path, out: Path) -> dict:
    base = yaml.safe_load((ROOT / "deploy" / "releases" / "acs2018_default.yaml").read_text())
    base.update({
        "name": f"shift-{shifted.stem.removeprefix('csv_p')}".replace("+", "-"),
        "description": f"{state.upper()} 2018 shifted ({shifted.name}) private, the other eleven shared states public.",
        "data_root": str(out.resolve()),
        "private": [{"path": shifted.name}],
        "public": [{"path": str((data / f"csv_p{s}.zip").resolve())} for s in STATES if s != state],
        "output_dir": str((out / "releases").resolve()), "work_dir": str((out / "work").resolve()),
    })
    return base


def build(source: Path, out: Path, shifts: list[str], state: str) -> dict:
    """Writes each shifted file (and its release config) under ``out``; returns the summary."""
    member, df = read_source(source)
    out.mkdir(parents=True, exist_ok=True)
    spec = load_domain_spec()
    summary = {}
    for shift in shifts:
        shifted = apply(df, shift)
        path = out / f"csv_p{state}_{shift}.zip"
        write_zip(shifted, member, path)
        _, report = load_person_file(path, spec, HouseholdRules())  # raises where the reader refuses it
        (out / f"{state}_{shift}.yaml").write_text(yaml.safe_dump(release_config(path, state, source.parent, out), sort_keys=False))
        summary[shift] = {"file": str(path), **describe(df, shifted, shift), "reader_persons_read": report["persons_read"]}
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default="nh", help="the shared 2018 state to shift (two-letter code)")
    ap.add_argument("--shifts", default=",".join(SHIFTS), help=f"comma-separated, from {','.join(SHIFTS)}")
    ap.add_argument("--data", default=str(DATA), help="folder of the shared 2018 files")
    ap.add_argument("--out", required=True, help="output folder (outside the repository)")
    args = ap.parse_args(argv)
    state = args.state.lower()
    if state not in STATES:
        ap.error(f"unknown state {args.state!r}; one of {', '.join(STATES)}")
    shifts = [s.strip() for s in args.shifts.split(",") if s.strip()]
    bad = [s for s in shifts if s not in SHIFTS]
    if bad:
        ap.error(f"unknown shifts {bad}; from {', '.join(SHIFTS)}")
    out = Path(args.out).resolve()
    if ROOT.resolve() in out.parents or out == ROOT.resolve():
        ap.error("write the shifted files outside the repository (they must never be committed)")
    summary = build(Path(args.data) / f"csv_p{state}.zip", out, shifts, state)
    (out / "shifts.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
