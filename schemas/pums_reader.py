"""Reading and validating Census PUMS person files (zip archives or CSV), in two layouts:

- ``pums2017``: ACS 2017+ person files ``psam_pNN.csv`` (inside ``csv_pXX.zip``): SERIALNO with a
  year prefix (``2018HU…`` housing unit, ``2018GQ…`` group-quarters person), zero-padded codes.
- ``pums_legacy``: pre-2017 files (``ssYYpXX.csv``, e.g. the R export in ``acs2013_1yr_de/``):
  no year prefix, unpadded codes, ``NA`` for blanks, optionally an R row-index first column and no
  SPORDER (it is then derived from the order of the persons inside each SERIALNO). A housing file
  (``ssYYhXX.csv``: SERIALNO, TYPE, NP) may sit beside it; when given, it classifies group quarters
  (TYPE 2/3), counts vacant units (NP = 0) and is cross-checked against the persons.

Every problem becomes an :class:`InputIssue` naming the file, the line (header = line 1) and the
column, and what was expected. No cell value ever appears in a message (they are confidential): the line and column locate it.
All checks are vectorised; only the error path scans lines in Python to locate a bad byte/row.
"""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from engine.errors import DPReleaseError
from schemas.domain_spec import DomainSpec, SourceColumn

LAYOUTS = ("pums2017", "pums_legacy")
_KNOWN_2017 = tuple(
    line.strip() for line in (Path(__file__).parent / "pums2017_person_columns.txt").read_text().splitlines() if line.strip() and not line.startswith("#")
)
_LEGACY_EXTRA = ("", "RT")
_BLANKS = {"pums2017": ("",), "pums_legacy": ("", "NA")}
_VARIABLE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True)
class InputIssue:
    file: str
    message: str
    line: int | None = None
    column: str | None = None
    count: int = 1
    check: str = ""

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f", line {self.line}"
        if self.column:
            where += f", column {self.column}"
        # the exact number of records concerned is a count of the confidential file: it stays in the
        # structured issue (``to_dict``, kept in the owner-only work directory), not in the text
        more = " (and more records like it)" if self.count > 1 else ""
        return f"{where}: {self.message}{more}"

    def to_dict(self) -> dict:
        return {"check": self.check, "file": self.file, "line": self.line, "column": self.column, "message": self.message, "count": self.count}


class InputError(DPReleaseError, ValueError):
    """Invalid input: carries every issue found (one line each)."""

    def __init__(self, issues: list[InputIssue]):
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


@dataclass
class PersonTable:
    """Validated raw persons of one file, in file order."""

    name: str
    layout: str
    sha256: str
    cols: dict[str, np.ndarray]  # source column -> int64 (blank = -1); SERIALNO -> household index
    n_households: int
    is_gq: np.ndarray  # per person
    line: np.ndarray  # per person: line number in the file
    vacant_units: int = 0
    extra: dict = field(default_factory=dict)
    survey_years: tuple[int, ...] | None = None  # the edition(s) of the file: public, as its name is


def survey_years(layout: str, path: Path, serials: np.ndarray) -> tuple[int, ...] | None:
    """The survey years a person file holds: a 2017+ file's SERIALNO starts with its record's year
    (a 1-year file holds one, a 5-year file five); a pre-2017 file carries none in its records, so
    its name's (``ss13pde.csv``: 2013), or None."""
    if layout == "pums2017":
        years = pd.to_numeric(pd.Series(pd.unique(pd.Series(serials, dtype=object).str.slice(0, 4))), errors="coerce").dropna()
        return tuple(sorted(int(y) for y in years))
    m = re.fullmatch(r"ss(\d\d)[ph][a-z]{2}\.csv", path.name, re.I)
    return (2000 + int(m.group(1)),) if m else None


def detect_layout(path: Path) -> str:
    if re.fullmatch(r"ss\d\dp[a-z]{2}\.csv", path.name, re.I):
        return "pums_legacy"
    return "pums2017"


# Compressed formats recognised by their leading bytes, so that a compressed file is named as
# such rather than reported as text that is not UTF-8. Only the zip archive the Census publishes
# is read; any other compression is refused with what it is, so there is one way in.
_MAGIC = (
    (re.compile(rb"\x1f\x8b"), "gzip"),
    (re.compile(rb"BZh[1-9]1AY&SY"), "bzip2"),
    (re.compile(rb"\xfd7zXZ\x00"), "xz"),
    (re.compile(rb"\x28\xb5\x2f\xfd"), "zstd"),
    (re.compile(rb"7z\xbc\xaf\x27\x1c"), "7-Zip"),
    (re.compile(rb"PK(?:\x03\x04|\x05\x06)"), "zip"),
)
_PERSON_MEMBER = re.compile(r"psam_p\d+\.csv|ss\d\dp[a-z]{2}\.csv", re.I)
_WORKBOOKS = (".xlsx", ".xlsm", ".ods")  # zip containers too, but not archives to unpack
_EXPECTED_FILE = "expected the Census .zip archive (csv_pXX.zip) or a plain CSV"


def _compression(raw: bytes) -> str | None:
    return next((kind for magic, kind in _MAGIC if magic.match(raw)), None)


def _person_member(archive: str, names: list[str]) -> str:
    """The one person CSV of a zip archive. A Census archive holds it beside a PDF readme; a second
    CSV (a housing file, an edited copy) would make the choice a guess, so it is refused."""
    real = [m for m in names if not m.endswith("/") and not m.startswith("__MACOSX/") and not Path(m).name.startswith("._")]  # macOS resource forks
    csvs = [m for m in real if m.lower().endswith(".csv")]
    persons = [m for m in csvs if _PERSON_MEMBER.fullmatch(Path(m).name)]
    expected = "exactly one person CSV member, psam_pNN.csv (2017+) or ssYYpXX.csv (earlier years)"
    if len(csvs) > 1:
        raise InputError([InputIssue(archive, f"{len(csvs)} CSV members {csvs}: expected {expected}; PDF and text members are ignored", check="zip")])
    if not persons:
        raise InputError([InputIssue(archive, f"no person CSV member among {real}: expected {expected}", check="zip")])
    return persons[0]


def _read_bytes(path: Path) -> tuple[str, bytes, str]:
    """(display name, raw bytes of the person CSV, SHA-256 of the file) from a zip archive or a CSV
    file; the file is read once."""
    if not path.exists():
        raise InputError([InputIssue(str(path), "file not found", check="file")])
    raw = path.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    if not raw:
        raise InputError([InputIssue(path.name, "file is empty (0 bytes)", check="file")])
    kind = _compression(raw)
    is_zip = path.suffix.lower() == ".zip"
    if kind is not None and kind != "zip":
        raise InputError([InputIssue(path.name, f"{kind}-compressed data: {_EXPECTED_FILE} (decompress it first)", check="file")])
    if kind == "zip" and path.suffix.lower() in _WORKBOOKS:
        raise InputError([InputIssue(path.name, f"a spreadsheet workbook: {_EXPECTED_FILE} (save the sheet as CSV)", check="file")])
    if kind == "zip" and not is_zip:
        raise InputError([InputIssue(path.name, f"a zip archive named {path.suffix or 'without a suffix'}: {_EXPECTED_FILE} (name the archive .zip)", check="file")])
    if not is_zip:
        return path.name, raw, sha
    try:
        zf = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile:
        raise InputError([InputIssue(path.name, "not a readable zip archive (corrupt or truncated file)", check="zip")]) from None
    with zf:
        member = _person_member(path.name, zf.namelist())
        name = f"{path.name}:{member}"
        try:
            data = zf.read(member)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
            what = "CRC check failed" if "CRC" in str(e) else "cannot be decompressed"
            raise InputError([InputIssue(name, f"corrupt zip member ({what}): the archive is damaged or truncated", check="zip")]) from None
    if not data:
        raise InputError([InputIssue(name, "file is empty (0 bytes)", check="file")])
    return name, data, sha


def _without_bom(data: bytes) -> bytes:
    """Drops a UTF-8 byte-order mark, as spreadsheet programs write one."""
    return data[3:] if data.startswith(b"\xef\xbb\xbf") else data


def _header(name: str, data: bytes) -> list[str]:
    """The column names on line 1. Quotes and surrounding spaces are stripped, as exports from
    spreadsheets and databases add them: a padded name is still unambiguous, and one that the
    stripping makes equal to another is refused as a duplicate. The CSV is then parsed with these
    names, so what is checked is what is read."""
    end = data.find(b"\n")
    try:
        line = data[: end if end >= 0 else len(data)].rstrip(b"\r").decode("utf-8")
    except UnicodeDecodeError:
        raise InputError([InputIssue(name, "the header line is not valid UTF-8 text", line=1, check="encoding")]) from None
    return [h.strip().strip('"').strip() for h in line.split(",")]


def _check_utf8(name: str, data: bytes, header: list[str]) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        line_start = data.rfind(b"\n", 0, e.start) + 1
        field_no = data.count(b",", line_start, e.start)
        col = header[field_no] if field_no < len(header) else None
        raise InputError([InputIssue(name, f"bytes that are not valid UTF-8 (byte offset {e.start})", line=line, column=col, check="encoding")]) from None


def _record_lines(data: bytes) -> np.ndarray:
    """Physical line number (header = 1) of every record; empty lines are skipped as pyarrow does."""
    buf = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(buf == 10)
    starts = np.r_[0, nl + 1]
    ends = np.r_[nl, len(buf)]
    length = ends - starts
    last_char = buf[np.maximum(ends - 1, 0)] if len(buf) else np.zeros(0, np.uint8)
    empty = (length == 0) | ((length == 1) & (last_char == 13))
    nonempty = np.flatnonzero(~empty) + 1  # 1-based line numbers
    return nonempty[1:].astype(np.int64)  # drop the header


def _locate_bad_row(name: str, data: bytes, n_fields: int) -> InputIssue:
    for i, raw in enumerate(data.split(b"\n")[1:], start=2):
        raw = raw.rstrip(b"\r")
        if not raw:
            continue
        k = raw.count(b",") + 1  # PUMS files carry no quoted commas
        if k != n_fields:
            return InputIssue(name, f"expected {n_fields} fields, got {k} (truncated or malformed row)", line=i, check="row")
    return InputIssue(name, "the CSV cannot be parsed", check="row")


def read_person_file(path: str | Path, spec: DomainSpec, layout: str = "auto", housing: str | Path | None = None,
                     householders: Literal["refuse", "exclude"] = "refuse") -> PersonTable:
    """Read, validate and parse one person file. Raises :class:`InputError` listing every issue.

    ``householders``: a housing unit without exactly one householder is an input error
    (``refuse``), or is left to the encoding to exclude (``exclude``: the rule of the person unit,
    ``schemas.ingestion.HouseholdRules.householders``)."""
    path = Path(path)
    layout = detect_layout(path) if layout == "auto" else layout
    if layout not in LAYOUTS:
        raise InputError([InputIssue(path.name, f"unknown layout {layout!r}; expected one of {LAYOUTS}", check="layout")])
    name, data, sha = _read_bytes(path)
    data = _without_bom(data)
    first_nl = data.find(b"\n")
    header = _header(name, data)
    if first_nl < 0 or not data[first_nl + 1 :].strip():
        raise InputError([InputIssue(name, "no person records after the header", line=1, check="file")])
    _check_utf8(name, data, header)

    # -- columns ---------------------------------------------------------------------
    issues: list[InputIssue] = []
    known = set(_KNOWN_2017) | (set(_LEGACY_EXTRA) if layout == "pums_legacy" else set())
    if not any(c in known for c in header):
        # never echo the names: a file without its header would show its first record here
        raise InputError([InputIssue(name, f"not a PUMS header (none of its {len(header)} names is a PUMS person variable): is the header line missing?", line=1, check="columns")])
    needed = [c for c, s in spec.source_columns.items() if not (layout == "pums_legacy" and s.derivable)]
    # A pre-2017 export read as pums2017 lacks SPORDER and may start with an unnamed row index:
    # those two findings have one cause, so they are reported once, as that cause.
    no_sporder = layout == "pums2017" and "SPORDER" in needed and "SPORDER" not in header and "SERIALNO" in header
    row_index = layout == "pums2017" and header[0] == ""
    if no_sporder or row_index:
        signs = ["no SPORDER column"] * no_sporder + ["an unnamed first column (a row index)"] * row_index
        issues.append(InputIssue(name, f"{' and '.join(signs)}, as in a pre-2017 file: expected the pums2017 header, or set layout: pums_legacy", line=1, column="SPORDER" if no_sporder else None, check="columns"))
    for c in needed:
        if c not in header and not (no_sporder and c == "SPORDER"):
            issues.append(InputIssue(name, f"missing column {c} (required by the domain spec, layout {layout})", line=1, column=c, check="columns"))
    for pos, c in enumerate(header, start=1):
        if c not in known and not (row_index and pos == 1):
            shown = repr(c) if _VARIABLE_NAME.fullmatch(c) else f"number {pos} (its name is not a variable name)"
            issues.append(InputIssue(name, f"unexpected column {shown}: not a PUMS person variable of layout {layout}", line=1, column=c if _VARIABLE_NAME.fullmatch(c) else None, check="columns"))
    dup = sorted({c for c in header if header.count(c) > 1 and c in known})
    if dup:
        issues.append(InputIssue(name, f"duplicate column names {dup}", line=1, column=dup[0], check="columns"))
    if issues:
        raise InputError(issues)
    present = [c for c in spec.source_columns if c in header]
    try:
        table = pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(
                include_columns=present,
                column_types={c: pa.string() for c in present},
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowException):
        raise InputError([_locate_bad_row(name, data, len(header))]) from None

    n = table.num_rows
    line = _record_lines(data)
    if len(line) != n:  # cannot happen for files pyarrow parsed; guard the line arithmetic
        raise InputError([InputIssue(name, "the CSV has quoted line breaks, which PUMS files never have", check="row")])
    blanks = _BLANKS[layout]
    cols: dict[str, np.ndarray] = {}
    for c in present:
        s = spec.source_columns[c]
        if s.type == "id":
            raw = table.column(c).to_pandas()
            bad = raw.isin(blanks).to_numpy()
            if bad.any():
                issues.append(InputIssue(name, "empty identifier (expected a SERIALNO)", line=int(line[bad][0]), column=c, count=int(bad.sum()), check="values"))
            cols[c] = raw.to_numpy(dtype=object)
            continue
        issues += _parse_int_column(name, c, s, table.column(c), blanks, line, cols)
    if issues:
        raise InputError(issues)

    # -- households ------------------------------------------------------------------
    serial = cols.pop("SERIALNO")
    hh, uniques = pd.factorize(serial, sort=False)
    hh = hh.astype(np.int64)
    n_hh = len(uniques)
    if "SPORDER" not in cols:  # legacy: derive from the order inside each SERIALNO
        order = np.argsort(hh, kind="stable")
        first = np.zeros(n_hh, dtype=np.int64)
        counts = np.bincount(hh, minlength=n_hh)
        first[1:] = np.cumsum(counts)[:-1]
        rank = np.empty(n, dtype=np.int64)
        rank[order] = np.arange(n) - np.repeat(first, counts)
        cols["SPORDER"] = rank + 1
    relp = cols[spec.relationship_column]
    gq_rel = np.isin(relp, spec.group_quarters_codes)
    vacant = 0
    extra: dict = {}
    if layout == "pums2017":
        tag = pd.Series(serial).str.slice(4, 6).to_numpy(dtype=object)
        is_gq_serial = tag == "GQ"
        bad_tag = ~np.isin(tag, ["HU", "GQ"])
        if bad_tag.any():
            issues.append(InputIssue(name, "SERIALNO does not have the 2017+ form YYYYHU… or YYYYGQ… (is this a pre-2017 file? set layout: pums_legacy)", line=int(line[bad_tag][0]), column="SERIALNO", count=int(bad_tag.sum()), check="households"))
        mismatch = (is_gq_serial != gq_rel) & ~bad_tag
        if mismatch.any():
            issues.append(InputIssue(name, f"relationship code and SERIALNO disagree on group quarters (RELP {spec.group_quarters_codes} must go with a GQ serial number)", line=int(line[mismatch][0]), column=spec.relationship_column, count=int(mismatch.sum()), check="households"))
        is_gq = gq_rel
    else:
        is_gq = gq_rel
        if housing is not None:
            vacant, extra, h_issues = _check_housing(Path(housing), serial, hh, n_hh, gq_rel, blanks)
            issues += h_issues

    # duplicate (SERIALNO, SPORDER)
    key = hh * 1000 + cols["SPORDER"]
    _, first_idx, cnt = np.unique(key, return_index=True, return_counts=True)
    dup_keys = cnt > 1
    if dup_keys.any():
        dmask = np.isin(key, np.unique(key)[dup_keys])
        dlines = line[dmask]
        issues.append(InputIssue(name, "duplicate person (SERIALNO, SPORDER): the same person number appears twice in one household", line=int(dlines[1] if len(dlines) > 1 else dlines[0]), column="SPORDER", count=int(dup_keys.sum()), check="households"))
    # exactly one householder per housing unit (unless the encoding excludes the others)
    if householders == "refuse":
        n_head = householder_counts(hh, relp, is_gq, spec.householder_code, n_hh)
        hu_hh = np.bincount(hh[~is_gq], minlength=n_hh) > 0
        for bad, msg in ((hu_hh & (n_head == 0), "household without a householder (no person with RELP 00)"), (n_head > 1, "household with more than one householder (RELP 00)")):
            if bad.any():
                first_line = int(line[bad[hh]][0])
                issues.append(InputIssue(name, msg, line=first_line, column=spec.relationship_column, count=int(bad.sum()), check="households"))
    # geography constant within a household
    for g in spec.geography:
        v = cols[g]
        lo = np.full(n_hh, np.iinfo(np.int64).max)
        hi = np.full(n_hh, np.iinfo(np.int64).min)
        np.minimum.at(lo, hh, v)
        np.maximum.at(hi, hh, v)
        bad = lo != hi
        if bad.any():
            issues.append(InputIssue(name, f"persons of one household have different {g} codes", line=int(line[bad[hh]][0]), column=g, count=int(bad.sum()), check="households"))
    if issues:
        raise InputError(issues)
    return PersonTable(name, layout, sha, cols | {"_household": hh}, n_hh, is_gq, line, vacant, extra,
                       survey_years(layout, Path(path), np.asarray(uniques, dtype=object)))


def householder_counts(hh: np.ndarray, relp: np.ndarray, is_gq: np.ndarray, householder_code: int, n_hh: int) -> np.ndarray:
    """Householders (relationship code ``householder_code``) among the housing-unit persons of
    every unit, ``(n_hh,)`` int64 (0 for group-quarters units)."""
    hu = ~is_gq
    return np.bincount(hh[hu], weights=(relp[hu] == householder_code).astype(np.float64), minlength=n_hh).astype(np.int64)


# an integer field: an optional minus and one to nine ASCII digits, the whole field (Arrow's regex
# engine, which runs without the GIL: the ingest tasks of a run parse their files in parallel)
_INTEGER = r"^-?[0-9]{1,9}$"


def _parse_int_column(name: str, c: str, s: SourceColumn, raw: pa.ChunkedArray, blanks, line: np.ndarray, cols: dict) -> list[InputIssue]:
    issues = []
    is_blank = pc.is_in(raw, value_set=pa.array(blanks, pa.string()))
    blank = is_blank.to_numpy(zero_copy_only=False).astype(bool)
    filled = pc.if_else(is_blank, pa.scalar("0", pa.string()), raw)
    not_int = ~pc.match_substring_regex(filled, _INTEGER).to_numpy(zero_copy_only=False).astype(bool)
    if not_int.any():
        i = int(np.flatnonzero(not_int)[0])
        issues.append(InputIssue(name, f"not an integer: expected {s.describe()}", line=int(line[i]), column=c, count=int(not_int.sum()), check="types"))
        return issues
    vals = pc.cast(filled, pa.int64()).to_numpy()
    if blank.any() and not s.blank:
        i = int(np.flatnonzero(blank)[0])
        issues.append(InputIssue(name, f"blank value, expected {s.describe()}", line=int(line[i]), column=c, count=int(blank.sum()), check="values"))
    vals = np.where(blank, -1, vals)
    if s.type == "int":
        bad = ~blank & ((vals < s.min) | (vals > s.max))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            issues.append(InputIssue(name, f"implausible value: expected {s.describe()}", line=int(line[i]), column=c, count=int(bad.sum()), check="values"))
    elif s.type == "code":
        bad = ~blank & ~np.isin(vals, s.codes or [])  # the spec validator requires codes here; none would reject every value
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            issues.append(InputIssue(name, f"code not in the data dictionary: expected {s.describe()}", line=int(line[i]), column=c, count=int(bad.sum()), check="values"))
    cols[c] = vals
    return issues


def _check_housing(path: Path, serial: np.ndarray, hh: np.ndarray, n_hh: int, gq_rel: np.ndarray, blanks) -> tuple[int, dict, list[InputIssue]]:
    """Cross-check a legacy housing file (SERIALNO, TYPE, NP) against the persons."""
    name, data, _ = _read_bytes(path)
    data = _without_bom(data)
    header = _header(name, data)
    wanted = ["SERIALNO", "TYPE", "NP"]
    missing = [c for c in wanted if c not in header]
    if missing:
        return 0, {}, [InputIssue(name, f"missing column {missing[0]}: expected a housing file with columns SERIALNO, TYPE and NP", line=1, column=missing[0], check="housing")]
    try:
        t = pacsv.read_csv(
            io.BytesIO(data),
            read_options=pacsv.ReadOptions(column_names=header, skip_rows=1),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),  # one record per line, as _record_lines counts
            convert_options=pacsv.ConvertOptions(include_columns=wanted, column_types=dict.fromkeys(wanted, pa.string())),
        )
    except pa.ArrowInvalid:
        return 0, {}, [_locate_bad_row(name, data, len(header))]
    h_line = _record_lines(data)
    h_serial = t.column("SERIALNO").to_numpy(zero_copy_only=False)
    h_type = pd.to_numeric(pd.Series(t.column("TYPE").to_numpy(zero_copy_only=False)), errors="coerce").to_numpy()
    h_np = pd.to_numeric(pd.Series(t.column("NP").to_numpy(zero_copy_only=False)), errors="coerce").to_numpy()
    issues = []
    bad = np.isnan(h_type) | ~np.isin(h_type, [1, 2, 3])
    if bad.any():
        issues.append(InputIssue(name, "TYPE must be 1 (housing unit), 2 or 3 (group quarters)", line=int(h_line[bad][0]), column="TYPE", count=int(bad.sum()), check="housing"))
        return 0, {}, issues
    dup = pd.Index(h_serial).duplicated()
    if dup.any():
        issues.append(InputIssue(name, "duplicate SERIALNO in the housing file (one record per unit expected)", line=int(h_line[dup][0]), column="SERIALNO", count=int(dup.sum()), check="housing"))
        return 0, {}, issues
    person_serials = pd.Index(pd.unique(serial))
    pos = pd.Index(h_serial).get_indexer(person_serials)
    missing = pos < 0
    if missing.any():
        issues.append(InputIssue(name, "persons whose SERIALNO has no housing record", count=int(missing.sum()), check="housing"))
        return 0, {}, issues
    n_persons = np.bincount(hh, minlength=n_hh)
    np_h = h_np[pos]
    type_h = h_type[pos]
    bad_np = (type_h == 1) & (np_h != n_persons)
    if bad_np.any():
        issues.append(InputIssue(name, "NP of the housing record differs from the number of persons in the person file", line=int(h_line[pos[bad_np][0]]), column="NP", count=int(bad_np.sum()), check="housing"))
    gq_from_type = np.isin(type_h, [2, 3])[hh]
    mismatch = gq_from_type != gq_rel
    if mismatch.any():
        issues.append(InputIssue(name, "TYPE (group quarters) disagrees with the persons' RELP codes", column="TYPE", count=int(mismatch.sum()), check="housing"))
    vacant = int(((h_type == 1) & (h_np == 0)).sum())
    return vacant, {"housing_file": name}, issues
