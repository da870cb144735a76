"""The inputs of a release are independent: no file is listed twice, no content appears under two
names, and no public file covers a private state in the same survey year.

A public input is charged nothing, so confidential rows that reach it (the private file listed
again, a copy of it, another file of the same state and survey year) would enter the release at no
privacy cost. The checks read only what identifies a file: its resolved path, its SHA-256 and size,
and the state and survey-year codes of its person records (the geography a private input covers is
public structure, and a survey year is the file's edition). Nothing else is read, and no hash
appears in a message.

Survey years: a 2017+ layout file's SERIALNO starts with the year of its record (a 1-year file
holds one year, a 5-year file five). Pre-2017 (``pums_legacy``) files carry no year, but every
one of them predates the 2017 layout: such a file overlaps a 2017+ file only where that one holds
records before 2017, and two pre-2017 files of one state cannot be told apart, so are refused.
An earlier year of the same state is a legitimate public prior (its respondents are another sample,
published by the Census Bureau): ``deploy/releases/de_2018_from_2013.yaml``.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from engine.errors import DPReleaseError
from schemas.pums_reader import InputError, InputIssue, _read_bytes, detect_layout, survey_years
from schemas.release_config import ReleaseConfig

FIRST_2017_LAYOUT_YEAR = 2017


class InputsNotIndependent(DPReleaseError, ValueError):
    """Two inputs are the same file or content, or a public input covers a private state in the
    same survey year (exit code 2, bad input)."""


@dataclass(frozen=True)
class InputFile:
    """One file a run reads: a person file or the housing file beside it (``kind``), named by its
    place in the config (``private.0.path``, ``public.1.housing``)."""

    role: str
    index: int
    kind: str  # "path" (the person file) or "housing"
    path: Path  # resolved
    sha256: str
    size: int
    layout: str

    @property
    def key(self) -> str:
        return f"{self.role}.{self.index}.{self.kind}"

    def __str__(self) -> str:
        return f"{self.key} {self.path}"


@dataclass(frozen=True)
class Coverage:
    """The states of a person file and its survey years (None: a pre-2017 file, year unknown)."""

    states: frozenset[int]
    years: frozenset[int] | None

    def shares_years(self, other: Coverage) -> bool:
        if self.years is None and other.years is None:
            return True
        if self.years is None or other.years is None:
            known = self.years if self.years is not None else other.years
            return any(y < FIRST_2017_LAYOUT_YEAR for y in known or ())
        return bool(self.years & other.years)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def identify_inputs(cfg: ReleaseConfig, skip_missing: bool = False) -> list[InputFile]:
    """Every file the config makes a run read, with its identity; a missing file is an
    :class:`InputError` (``skip_missing``: left out, for ``dprelease plan`` on a machine without
    the data)."""
    out = []
    for role, specs in (("private", cfg.private), ("public", cfg.public)):
        for index, spec in enumerate(specs):
            layout = detect_layout(cfg.input_path(spec)) if spec.layout == "auto" else spec.layout
            for kind, given in (("path", cfg.input_path(spec)), ("housing", cfg.housing_path(spec))):
                if given is None:
                    continue
                path = given.resolve()
                if not path.is_file():
                    if skip_missing:
                        continue
                    raise InputError([InputIssue(str(path), f"file not found ({role}.{index}.{kind})", check="file")])
                out.append(InputFile(role, index, kind, path, sha256_file(path), path.stat().st_size, layout))
    return out


def check_identities(files: list[InputFile]) -> None:
    """Refuse a file listed twice (the same resolved path) or one content under two names."""
    for a, b in combinations(files, 2):
        if a.path == b.path:
            raise InputsNotIndependent(f"{a.key} and {b.key} are the same file {a.path}: each input file is listed once, as private or as public")
        if (a.sha256, a.size) == (b.sha256, b.size):
            raise InputsNotIndependent(f"{a} and {b} have the same content (equal SHA-256): each input file is listed once, as private or as public")


@lru_cache(maxsize=128)
def read_coverage(f: InputFile, state_column: str) -> Coverage | None:
    """The states and survey years of a person file from its state and SERIALNO columns alone;
    None when they cannot be read (ingestion's validation then names the problem)."""
    try:
        _, data, _ = _read_bytes(f.path)
    except InputError:
        return None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    columns = [state_column] + (["SERIALNO"] if f.layout == "pums2017" else [])
    try:
        table = pacsv.read_csv(io.BytesIO(data), convert_options=pacsv.ConvertOptions(
            include_columns=columns, column_types=dict.fromkeys(columns, pa.string())))
    except (pa.ArrowException, KeyError):
        return None
    states = pd.to_numeric(pd.Series(pc.unique(table.column(state_column)).to_pylist()), errors="coerce").dropna()
    # a pre-2017 file's year is unknown here (its name may say it, but two files of one state cannot be told apart)
    years = frozenset(survey_years(f.layout, f.path, pc.unique(table.column("SERIALNO")).to_numpy(zero_copy_only=False)) or ()) \
        if f.layout == "pums2017" else None
    return Coverage(frozenset(int(s) for s in np.asarray(states)), years)


def public_states(files: list[InputFile], state_column: str) -> set[int]:
    """The states the public person files among ``files`` cover (their state codes, read once)."""
    return {s for f in files if f.role == "public" and f.kind == "path" and (c := read_coverage(f, state_column)) is not None for s in c.states}


def check_states(coverage: dict[InputFile, Coverage]) -> None:
    """Refuse a public person file covering a state of a private one in a shared survey year."""
    private = [(f, c) for f, c in coverage.items() if f.role == "private"]
    for pub, pub_cov in coverage.items():
        if pub.role != "public":
            continue
        for priv, priv_cov in private:
            shared = sorted(pub_cov.states & priv_cov.states)
            if shared and pub_cov.shares_years(priv_cov):
                if pub_cov.years is not None and priv_cov.years is not None:
                    years = f"survey year {', '.join(str(y) for y in sorted(pub_cov.years & priv_cov.years))}"
                else:
                    years = "a survey year it may share (pre-2017 files carry no year)"
                raise InputsNotIndependent(f"{pub} covers state {', '.join(str(s) for s in shared)} of {priv} in {years}: "
                                           "a public input must come from other states or other survey years")


def check_inputs(cfg: ReleaseConfig, skip_missing: bool = False) -> list[InputFile]:
    """Identify every input file and refuse inputs that are not independent (before anything
    else is read); returns the identities (the run's binding record keeps them)."""
    files = identify_inputs(cfg, skip_missing)
    check_identities(files)
    state_column = cfg.geography.state
    coverage = {f: c for f in files if f.kind == "path" and (c := read_coverage(f, state_column)) is not None}
    check_states(coverage)
    return files
