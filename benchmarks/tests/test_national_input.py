"""benchmarks/national_input.py: re-keyed copies of the shared states are valid PUMS inputs with
the same records, new geography and globally unique serial numbers."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import ROOT, load_benchmark


@pytest.fixture(scope="module")
def national():
    return load_benchmark("national_input")


def read(path: Path) -> pd.DataFrame:
    with zipfile.ZipFile(path) as z:
        (member,) = [m for m in z.namelist() if m.startswith("psam_p")]
        with z.open(member) as f:
            return pd.read_csv(f, dtype=str, keep_default_na=False)


def test_two_copies_of_the_shared_states(national, data_root, tmp_path):
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file

    data = data_root / "acs2018_1yr"
    summary = national.build(data, tmp_path / "out", None, 2)
    files = sorted((tmp_path / "out").glob("csv_p*.zip"))
    assert summary["states"] == len(files) == 24
    frames = {f.name: read(f) for f in files}
    allp = pd.concat(frames.values(), ignore_index=True)
    sources = pd.concat([read(data / f"csv_p{s}.zip")[list(allp.columns)] for s in national.SOURCES], ignore_index=True)
    assert len(allp) == 2 * len(sources) == summary["persons"]
    # the same records: every non-key column's value counts are twice the sources'
    for c in [c for c in allp.columns if c not in ("SERIALNO", "ST", "PUMA")]:
        assert allp[c].value_counts().sort_index().equals(2 * sources[c].value_counts().sort_index()), c
    # serials unique across the input (households of different copies never merge), kind kept
    hh = allp.drop_duplicates("SERIALNO")
    assert len(hh) == summary["households"] == 2 * sources.SERIALNO.nunique()
    assert allp.SERIALNO.str.fullmatch(national.SURVEY_YEAR + r"(HU|GQ)\d{7}").all()
    for name, df in frames.items():
        fips = df.ST.iloc[0]
        assert (df.ST == fips).all() and national.TARGETS[fips] == name[len("csv_p"):-len(".zip")]
    assert summary["pumas"] == sum(df.PUMA.nunique() for df in frames.values()) == 2 * sum(
        read(data / f"csv_p{s}.zip").PUMA.nunique() for s in national.SOURCES)
    # a generated file is a valid input for the pipeline's reader
    first, report = load_person_file(files[0], load_domain_spec(), HouseholdRules())
    assert report["persons_read"] == len(frames[files[0].name]) and first.n_persons > 0  # group quarters excluded by default
    cfg = yaml.safe_load((tmp_path / "out" / "national.yaml").read_text())
    assert len(cfg["private"]) == 24 and len(cfg["public"]) == 12
    # the re-keyed geography is declared beside the input: its PUMA list is exactly the files' PUMAs
    from schemas.release_config import load_config

    loaded = load_config(tmp_path / "out" / "national.yaml")
    declared = loaded.puma_list()
    assert set(declared.pumas) == {(int(st), int(p)) for st, p in allp[["ST", "PUMA"]].drop_duplicates().itertuples(index=False)}
    # the copies are another survey year than the public originals: the inputs pass the pre-flight checks
    from flows.preflight import preflight

    assert len(preflight(loaded)) == 36


def test_it_refuses_to_write_inside_the_repository(national):
    with pytest.raises(SystemExit):
        national.main(["--out", str(ROOT / "generated"), "--scale", "1"])
