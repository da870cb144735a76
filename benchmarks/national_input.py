"""A national-size PUMS input built from the 12 shared 2018 states.

52 target states (the 50 states, DC and Puerto Rico, by their FIPS codes) are filled with copies
of the shared states' person records, re-keyed: each copy gets the target's ST, new PUMA codes
(unique within the target) and new SERIALNO numbers (unique in the whole input, the HU/GQ kind
kept) in survey year 2019, the records themselves unchanged. The copies stand for another year's
files of their target states: the public inputs are the 12 original 2018 files, and a public file
of a private state's own survey year would be refused as not independent
(``schemas.input_independence``). ``--pumas-per-state`` sets the size: about 46 gives the
1-year PUMS's ~2,400 PUMAs and ~1.3 M households; ``--scale K`` instead builds K copies of the 12
states (1×, 4×, 16× of the shared data) for the scale curve.

Only the columns the domain specs read are kept (the reader needs no others). The files are
written as ``csv_pXX.zip`` (member ``psam_pNN.csv``) under ``--out`` with a release config beside
them (``national.yaml``: every target state private, the 12 original states public) and the PUMA
list of the re-keyed geography (``pumas.yaml``, the config's ``geography.pumas``: the input's
geography is the benchmark's own, so it is declared beside it), so that

    python benchmarks/national_input.py --out /tmp/national
    dprelease run /tmp/national/national.yaml

runs the whole pipeline at national size. Never commit the generated files (they are copies of
the shared data).
"""

from __future__ import annotations

import argparse
import io
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from schemas.domain_spec import load_domain_spec  # noqa: E402

SOURCES = ["de", "id", "me", "mt", "nd", "ne", "nh", "nm", "ri", "sd", "vt", "wy"]
TARGETS = {  # FIPS code: USPS abbreviation, the 50 states, DC and Puerto Rico
    "01": "al", "02": "ak", "04": "az", "05": "ar", "06": "ca", "08": "co", "09": "ct", "10": "de", "11": "dc",
    "12": "fl", "13": "ga", "15": "hi", "16": "id", "17": "il", "18": "in", "19": "ia", "20": "ks", "21": "ky",
    "22": "la", "23": "me", "24": "md", "25": "ma", "26": "mi", "27": "mn", "28": "ms", "29": "mo", "30": "mt",
    "31": "ne", "32": "nv", "33": "nh", "34": "nj", "35": "nm", "36": "ny", "37": "nc", "38": "nd", "39": "oh",
    "40": "ok", "41": "or", "42": "pa", "44": "ri", "45": "sc", "46": "sd", "47": "tn", "48": "tx", "49": "ut",
    "50": "vt", "51": "va", "53": "wa", "54": "wv", "55": "wi", "56": "wy", "72": "pr",
}
KEYS = ["RT", "SERIALNO", "SPORDER", "ST", "PUMA"]
SURVEY_YEAR = "2019"  # the copies' SERIALNO prefix: not the public files' 2018 (module docstring)


def columns() -> list[str]:
    cols = list(KEYS)
    for spec in ("acs_pums.yaml", "acs_pums_aim.yaml"):
        path = ROOT / "schemas" / "domains" / spec
        if path.exists():
            cols += [c for c in load_domain_spec(path).source_columns if c not in cols]
    return cols


def read_state(data: Path, abbr: str, cols: list[str]) -> pd.DataFrame:
    with zipfile.ZipFile(data / f"csv_p{abbr}.zip") as z:
        member = next(m for m in z.namelist() if m.startswith("psam_p") and m.endswith(".csv"))
        with z.open(member) as f:
            header = f.readline().decode().strip().split(",")
        with z.open(member) as f:
            return pd.read_csv(f, dtype=str, keep_default_na=False, usecols=[c for c in cols if c in header])


def plan(sources: dict[str, pd.DataFrame], pumas_per_state: int | None, scale: int | None) -> dict[str, list[str]]:
    """{target FIPS: [source abbreviations, one per copy]}."""
    targets = list(TARGETS)
    if scale is not None:  # K copies of every source, spread over the targets in turn
        copies = [s for _ in range(scale) for s in SOURCES]
        out: dict[str, list[str]] = {t: [] for t in targets}
        for i, s in enumerate(copies):
            out[targets[i % len(targets)]].append(s)
        return {t: v for t, v in out.items() if v}
    n_pumas = {s: df.PUMA.nunique() for s, df in sources.items()}
    out, k = {}, 0
    for t in targets:
        out[t], got = [], 0
        while got < pumas_per_state:
            s = SOURCES[k % len(SOURCES)]
            out[t].append(s)
            got += n_pumas[s]
            k += 1
    return out


def build(data: Path, out: Path, pumas_per_state: int | None, scale: int | None) -> dict:
    cols = columns()
    t0 = time.time()
    sources = {s: read_state(data, s, cols) for s in SOURCES}
    layout = plan(sources, pumas_per_state, scale)
    out.mkdir(parents=True, exist_ok=True)
    next_serial = 1
    summary = {"states": 0, "pumas": 0, "persons": 0, "households": 0}
    puma_list: dict[int, list[int]] = {}
    for fips, copies in layout.items():
        parts, puma_base = [], 1
        for s in copies:
            df = sources[s].copy()
            old = df.PUMA.to_numpy()
            codes, inverse = np.unique(old, return_inverse=True)
            df["PUMA"] = pd.Series(100 * (inverse + puma_base), index=df.index).astype(str).str.zfill(5)
            puma_list.setdefault(int(fips), []).extend(int(100 * (k + puma_base)) for k in range(codes.size))
            puma_base += codes.size
            serial_index, uniq = pd.factorize(df.SERIALNO)
            kind = pd.Series(uniq.str.slice(4, 6)).to_numpy()[serial_index]
            numbers = serial_index + next_serial
            next_serial += len(uniq)
            df["SERIALNO"] = SURVEY_YEAR + pd.Series(kind, index=df.index) + pd.Series(numbers, index=df.index).astype(str).str.zfill(7)
            df["ST"] = fips
            parts.append(df)
        state = pd.concat(parts, ignore_index=True)
        summary["states"] += 1
        summary["pumas"] += int(state.PUMA.nunique())
        summary["persons"] += len(state)
        summary["households"] += int(state.SERIALNO.nunique())
        buf = io.StringIO()
        state.to_csv(buf, index=False)
        with zipfile.ZipFile(out / f"csv_p{TARGETS[fips]}.zip", "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
            z.writestr(f"psam_p{fips}.csv", buf.getvalue())
        print(f"  ST={fips} ({TARGETS[fips].upper()}): {len(copies)} copies, {state.PUMA.nunique()} PUMAs, {len(state)} persons "
              f"[{time.time() - t0:.0f} s]", flush=True)
    if next_serial > 10**7:
        raise RuntimeError("more than 9,999,999 households: SERIALNO numbers would not fit in 7 digits")
    base = yaml.safe_load((ROOT / "deploy" / "releases" / "acs2018_default.yaml").read_text())
    base.update({
        "name": "national", "data_root": str(out.resolve()),
        "private": [{"path": f"csv_p{TARGETS[f]}.zip"} for f in layout],
        "public": [{"path": str((data / f"csv_p{s}.zip").resolve())} for s in SOURCES],
        "output_dir": str((out / "releases").resolve()), "work_dir": str((out / "work").resolve()),
        "geography": {"pumas": "pumas.yaml"},
    })
    (out / "pumas.yaml").write_text(yaml.safe_dump({"vintage": "re-keyed copies of the shared 2018 states", "states": puma_list}))
    (out / "national.yaml").write_text(yaml.safe_dump(base, sort_keys=False))
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "acs2018_1yr"))
    ap.add_argument("--out", required=True, help="output directory (outside the repository)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--pumas-per-state", type=int, default=46, help="PUMAs per target state (46: national size)")
    size.add_argument("--scale", type=int, default=None, help="K copies of the 12 shared states instead")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    if ROOT in out.parents or out == ROOT:
        ap.error("write the generated input outside the repository (it must never be committed)")
    summary = build(Path(args.data), out, None if args.scale else args.pumas_per_state, args.scale)
    print(f"{summary['states']} states, {summary['pumas']} PUMAs, {summary['households']} households, "
          f"{summary['persons']} persons -> {out} (config {out / 'national.yaml'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
