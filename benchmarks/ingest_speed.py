"""Ingestion speed: load + validate + encode all 12 states of ACS 2018, against a plain pandas
read of the same columns as the baseline measured in the same run; optionally the default
end-to-end release (Prefect + Dask start-up included).

Targets: all 12 states <= 5 s on 2 cores; the default end-to-end run <= 2 minutes.

    .venv/bin/python benchmarks/ingest_speed.py [--end-to-end]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from schemas.domain_spec import load_domain_spec  # noqa: E402
from schemas.ingestion import HouseholdRules, load_person_file  # noqa: E402

DATA = Path(os.environ.get("DPRELEASE_DATA", ROOT.parent / "shared" / "data")) / "acs2018_1yr"


def ours() -> tuple[float, int, int]:
    spec = load_domain_spec()
    t = time.perf_counter()
    n_h = n_p = 0
    for z in sorted(DATA.glob("csv_p*.zip")):
        d, _ = load_person_file(z, spec, HouseholdRules())
        n_h += d.n_households
        n_p += d.n_persons
    return time.perf_counter() - t, n_h, n_p


def pandas_baseline() -> float:
    """Just reading the needed columns with pandas (no validation, no encoding)."""
    cols = list(load_domain_spec().source_columns)
    t = time.perf_counter()
    for z in sorted(DATA.glob("csv_p*.zip")):
        with zipfile.ZipFile(z) as zf:
            member = next(m for m in zf.namelist() if m.endswith(".csv"))
            pd.read_csv(zf.open(member), usecols=cols, dtype=str, keep_default_na=False)
    return time.perf_counter() - t


def end_to_end() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ROOT / "deploy" / "releases" / "acs2018_default.yaml"
        env = dict(os.environ, DPRELEASE_DATA=str(DATA.parent))
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flows.cli", "run", str(cfg), "--name", "bench-e2e"], cwd=tmp, env=env, check=True, capture_output=True)
        wall = time.perf_counter() - t
        shutil.rmtree(tmp, ignore_errors=True)
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--end-to-end", action="store_true", help="also time the default release end to end")
    args = ap.parse_args()
    base = pandas_baseline()
    t, n_h, n_p = ours()
    print(f"{'step':<42}{'seconds':>10}")
    print(f"{'pandas read_csv of the columns (baseline)':<42}{base:>10.2f}")
    print(f"{'dprelease load+validate+encode':<42}{t:>10.2f}   ({n_h} households, {n_p} persons)")
    print(f"ratio dprelease / pandas-read baseline: {t / base:.2f}x  (target: <= 5 s on 2 cores)")
    if args.end_to_end:
        print(f"{'default release end to end':<42}{end_to_end():>10.2f}   (target <= 120 s)")


if __name__ == "__main__":
    main()
