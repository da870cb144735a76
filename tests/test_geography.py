"""The release's geography from public information (``schemas.geography``): the shipped PUMA list,
the check of the private records against the declared geography, the release's nodes."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

from schemas.geography import PumaListError, load_puma_list, shipped_puma_list
from schemas.pums_reader import InputError
from schemas.release_config import ReleaseConfig
from tests.conftest import ACS2013_DE, ACS2018, DATA_ROOT


def _codes(raw: bytes) -> set[tuple[int, int]]:
    t = pacsv.read_csv(io.BytesIO(raw), convert_options=pacsv.ConvertOptions(include_columns=["ST", "PUMA"],
                                                                            column_types={"ST": pa.int64(), "PUMA": pa.int64()}))
    return set(zip(t.column("ST").to_pylist(), t.column("PUMA").to_pylist()))


def test_the_shipped_list_is_the_census_files_pumas(data_root):
    """The shipped 2010-vintage list holds exactly the PUMAs of the Census files it was transcribed
    from (every PUMA appears in every 1-year file of its state)."""
    seen: set[tuple[int, int]] = set()
    for path in sorted(ACS2018.glob("csv_p*.zip")):
        with zipfile.ZipFile(path) as z:
            seen |= _codes(z.read(next(n for n in z.namelist() if n.endswith(".csv"))))
    assert set(shipped_puma_list().pumas) == seen
    delaware_2013 = _codes((ACS2013_DE / "ss13pde.csv").read_bytes())
    assert delaware_2013 == set(shipped_puma_list().restricted([10]).pumas)


def config(private: str, **geography) -> ReleaseConfig:
    return ReleaseConfig.model_validate({
        "name": "geo", "data_root": str(DATA_ROOT),
        "private": [{"path": private}], "public": [{"path": "acs2018_1yr/csv_pnh.zip"}],
        "budget": {"rho": 1.0},
        "advanced": {"allocation": {"stages": {"count_of_counts": 0.2, "state_synthesis": 0.4, "puma_synthesis": 0.4},
                                    "levels": {"count_of_counts": {"nation": 0.2, "state": 0.3, "puma": 0.5},
                                               "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}},
                                    "synthesis_split": "fixed"}},
        **({"geography": geography} if geography else {}),
    })


@pytest.fixture(scope="module")
def vermont_lines() -> list[str]:
    """The header and the first persons of Vermont's housing units (the file starts with group quarters)."""
    with zipfile.ZipFile(ACS2018 / "csv_pvt.zip") as z:
        lines = z.open("psam_p50.csv").read().decode().splitlines()
    return [lines[0], *[line for line in lines[1:] if "HU" in line.split(",")[1]][:120]]


def _write(tmp_path, lines: list[str], line: int | None = None, column: str = "PUMA", value: str = "") -> str:
    """The lines, with ``column`` of every person of line ``line``'s household set to ``value``
    (geography is constant within a household)."""
    lines = list(lines)
    if line is not None:
        header = lines[0].split(",")
        serial = lines[line - 1].split(",")[header.index("SERIALNO")]
        for i, text in enumerate(lines[1:], start=1):
            cells = text.split(",")
            if cells[header.index("SERIALNO")] == serial:
                cells[header.index(column)] = value
                lines[i] = ",".join(cells)
    path = tmp_path / "vt.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_private_record_outside_the_declared_geography_is_refused(tmp_path, vermont_lines):
    from tasks.ingest import load_input

    # PUMA 00900 is a valid code (the domain spec's range) but no PUMA of Vermont
    bad = _write(tmp_path, vermont_lines, line=40, column="PUMA", value="00900")
    cfg = config(bad)
    with pytest.raises(InputError) as e:
        load_input(cfg, cfg.private[0], "private")
    msg = str(e.value)
    first = next(i for i, text in enumerate(vermont_lines[1:], start=2)
                 if text.split(",")[1] == vermont_lines[39].split(",")[1])
    assert f"vt.csv, line {first}, column PUMA" in msg and "declared PUMAs of ST=50: 00100, 00200, 00300, 00400" in msg
    assert "900" not in msg  # the cell's value stays out of the message
    data, _ = load_input(cfg, cfg.private[0], "public")  # a public input's geography is not the release's
    assert data.n_households > 0
    # a declared state list without the file's state: the state column is named, with the declared states
    cfg = config(_write(tmp_path, vermont_lines), states=[10, 23])
    with pytest.raises(InputError, match="vt.csv, line 2, column ST: a state outside the declared geography \\(declared states: 10, 23\\)"):
        load_input(cfg, cfg.private[0], "private")


def test_the_release_nodes_are_the_declared_states_published_pumas(tmp_path, vermont_lines):
    """Default: the private files' states, each with every PUMA of the list, whether or not the
    private records reach it; declared states may include one without private records."""
    from tasks.ingest import load_input, release_geography
    from tasks.run_context import save_npz_atomic

    few = vermont_lines[:30]  # a few households: not every Vermont PUMA among them
    cfg = config(_write(tmp_path, few))
    data, _ = load_input(cfg, cfg.private[0], "private")
    save_npz_atomic(tmp_path / "private.npz", data.to_npz)
    assert len(np.unique(data.geo[:, 1])) < 4
    vermont = shipped_puma_list().restricted([50])
    assert release_geography(cfg, str(tmp_path / "private.npz")) == vermont and len(vermont.pumas) == 4
    declared = config(cfg.private[0].path, states=[10, 50])
    assert release_geography(declared, str(tmp_path / "private.npz")) == shipped_puma_list().restricted([10, 50])


def test_a_puma_list_is_parsed_once_per_file_version(tmp_path):
    """The list is parsed once per process and version of the file: the same object again, a
    rewritten file read anew, a broken one refused every time it is asked for."""
    path = tmp_path / "pumas.yaml"
    path.write_text("vintage: 2010\nstates:\n  50: [100, 200]\n")
    first = load_puma_list(path)
    assert load_puma_list(path) is first and first.pumas == ((50, 100), (50, 200))
    path.write_text("vintage: 2010\nstates:\n  50: [100, 200, 300]\n  33: [100]\n")
    assert load_puma_list(path).pumas == ((33, 100), (50, 100), (50, 200), (50, 300))
    path.write_text("vintage: 2010\nstates: [1, 2, 3]\n")
    for _ in range(2):
        with pytest.raises(PumaListError, match="a mapping with `states`"):
            load_puma_list(path)
    with pytest.raises(PumaListError, match="cannot read"):
        load_puma_list(tmp_path / "missing.yaml")
