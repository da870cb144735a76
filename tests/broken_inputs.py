"""Broken PUMS inputs, cut programmatically from the real Census files in ``../shared/data``.

Each builder takes a temporary directory, writes one small damaged input there (a few hundred
records cut from a real file, never a copy of the file) and returns a :class:`Broken` that says
what ``schemas.pums_reader.read_person_file`` must report: the check kind, the file shown in the
message, the line (header = line 1), the column and the exact message, plus the values that
must never appear in any message (SERIALNOs and the offending cell values are confidential).

Bases:
- 2018 (layout ``pums2017``): Vermont ``csv_pvt.zip`` member ``psam_p50.csv``: the first 40
  group-quarters persons followed by the first ~260 housing-unit persons, cut at a household
  boundary (the file is sorted by SERIALNO, and every GQ serial sorts before every HU one).
- 2013 (layout ``pums_legacy``): Delaware ``ss13pde.csv`` cut to the first ~300 persons at a
  household boundary and ``ss13hde.csv`` cut to the housing records up to the last kept SERIALNO.

Builders are registered in :data:`BUILDERS` (name -> builder) for parametrised tests.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

DATA = Path(os.environ.get("DPRELEASE_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
ACS2018 = DATA / "acs2018_1yr"
ACS2013 = DATA / "acs2013_1yr_de"
CORE = "acs_pums_core"  # the domain spec of the 2013 extract (schemas/domains/acs_pums_core.yaml)
VT_ZIP = ACS2018 / "csv_pvt.zip"
VT_MEMBER = "psam_p50.csv"
LEGACY_P = ACS2013 / "ss13pde.csv"
LEGACY_H = ACS2013 / "ss13hde.csv"

N_GQ = 40  # group-quarters persons kept from the 2018 file
N_HU = 260  # at least this many housing-unit persons (then up to the household's end)
N_LEGACY = 300  # at least this many 2013 persons (then up to the household's end)

SERIAL_2017_RE = re.compile(r"\d{4}(?:HU|GQ)\d+")


def data_available() -> bool:
    return VT_ZIP.is_file() and LEGACY_P.is_file() and LEGACY_H.is_file()


# -- tables ----------------------------------------------------------------------------
@dataclass
class Table:
    """A CSV as raw byte tokens (quotes kept), so it is written back byte for byte."""

    header: list[bytes]
    rows: list[list[bytes]]

    @property
    def names(self) -> list[str]:
        return [h.decode().strip('"') for h in self.header]

    def col(self, name: str) -> int:
        return self.names.index(name)

    def copy(self) -> Table:
        return Table(list(self.header), [list(r) for r in self.rows])

    @staticmethod
    def line(i: int) -> int:
        """File line of record ``i`` (header = line 1)."""
        return i + 2

    def get(self, i: int, name: str) -> str:
        return self.rows[i][self.col(name)].decode().strip('"')

    def set(self, i: int, name: str, value: str | bytes) -> None:
        self.rows[i][self.col(name)] = value.encode() if isinstance(value, str) else value

    def serial(self, i: int) -> str:
        return self.get(i, "SERIALNO")

    def households(self) -> dict[str, list[int]]:
        """SERIALNO -> record indices, in file order."""
        out: dict[str, list[int]] = {}
        for i in range(len(self.rows)):
            out.setdefault(self.serial(i), []).append(i)
        return out

    def find_household(self, size: int, gq: bool = False) -> list[int]:
        """Record indices of the first household of exactly ``size`` persons (GQ or HU)."""
        for _, idx in self.households().items():
            is_gq = self.get(idx[0], "RELP") in ("16", "17")
            if len(idx) == size and is_gq == gq:
                return idx
        raise LookupError(f"no {'GQ' if gq else 'HU'} household of size {size} in the sample")

    def to_bytes(self) -> bytes:
        return b"".join(b",".join(r) + b"\n" for r in [self.header, *self.rows])

    def write(self, path: Path) -> Path:
        path.write_bytes(self.to_bytes())
        return path


def _split(data: bytes) -> tuple[list[bytes], list[list[bytes]]]:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines[0].split(b","), [ln.split(b",") for ln in lines[1:]]


def _cut_at_household(rows: list[list[bytes]], serial_col: int, n: int) -> list[list[bytes]]:
    while n < len(rows) and rows[n][serial_col] == rows[n - 1][serial_col]:
        n += 1
    return rows[:n]


@lru_cache(maxsize=1)
def _vt_member_bytes() -> bytes:
    with zipfile.ZipFile(VT_ZIP) as zf:
        return zf.read(VT_MEMBER)


@lru_cache(maxsize=1)
def _base_2018() -> Table:
    header, rows = _split(_vt_member_bytes())
    s = Table(header, []).col("SERIALNO")
    gq = [r for r in rows if r[s][4:6] == b"GQ"]
    hu = [r for r in rows if r[s][4:6] == b"HU"]
    return Table(header, gq[:N_GQ] + _cut_at_household(hu, s, N_HU))


def base_2018() -> Table:
    """A fresh (mutable) copy of the 2018 Vermont sample."""
    return _base_2018().copy()


@lru_cache(maxsize=1)
def _base_legacy() -> tuple[Table, Table]:
    header, rows = _split(LEGACY_P.read_bytes())
    persons = Table(header, _cut_at_household(rows, Table(header, []).col("SERIALNO"), N_LEGACY))
    last = int(persons.serial(len(persons.rows) - 1))
    h_header, h_rows = _split(LEGACY_H.read_bytes())
    s = Table(h_header, []).col("SERIALNO")
    housing = Table(h_header, [r for r in h_rows if int(r[s]) <= last])
    return persons, housing


def base_legacy() -> tuple[Table, Table]:
    """Fresh copies of the 2013 Delaware (persons, housing) samples."""
    p, h = _base_legacy()
    return p.copy(), h.copy()


ONE_PERSON_MEMBER = "exactly one person CSV member, psam_pNN.csv (2017+) or ssYYpXX.csv (earlier years)"


def write_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def member_data_span(path: Path, member: str) -> tuple[int, int]:
    """(start, end) byte offsets of a member's compressed data inside a zip file."""
    raw = path.read_bytes()
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    off = info.header_offset
    assert raw[off : off + 4] == b"PK\x03\x04"
    name_len = int.from_bytes(raw[off + 26 : off + 28], "little")
    extra_len = int.from_bytes(raw[off + 28 : off + 30], "little")
    start = off + 30 + name_len + extra_len
    return start, start + info.compress_size


# -- expectations ------------------------------------------------------------------------
@dataclass(frozen=True)
class Broken:
    """One broken input and the single issue the reader must report for it."""

    path: Path
    file: str  # the file name shown in the message (zip: "archive.zip:member.csv")
    check: str
    line: int | None
    column: str | None
    message: str  # the exact message
    keywords: tuple[str, ...]  # words the message must contain (also checked case-insensitively)
    secrets: tuple[str, ...] = ()  # values that must never appear in a message
    count: int = 1  # records concerned (the message says "and more records like it" when above 1, never the count)
    layout: str = "auto"
    housing: Path | None = None
    extra: dict = field(default_factory=dict)
    domain: str = "acs_pums"  # the spec it is read with (CORE for the 2013 extract: no SCHL, MAR, CIT)

    def read_kwargs(self) -> dict:
        return {"layout": self.layout, "housing": self.housing}

    def spec(self):
        from schemas.domain_spec import load_domain_spec

        return load_domain_spec(self.domain)

    def cli_args(self) -> list[str]:
        args = ["validate", str(self.path)]
        if self.layout != "auto":
            args += ["--layout", self.layout]
        if self.housing is not None:
            args += ["--housing", str(self.housing)]
        if self.domain != "acs_pums":
            args += ["--domain", self.domain]
        return args

    def expected_output(self) -> str:
        where = self.file
        if self.line is not None:
            where += f", line {self.line}"
        if self.column:
            where += f", column {self.column}"
        more = " (and more records like it)" if self.count > 1 else ""
        return f"INVALID {where}: {self.message}{more}\n"


BUILDERS: dict[str, Callable[[Path], Broken]] = {}


def builder(fn: Callable[[Path], Broken]) -> Callable[[Path], Broken]:
    BUILDERS[fn.__name__.removeprefix("build_")] = fn
    return fn


CSV = VT_MEMBER  # name of the 2018 CSV written by the builders (layout detected as pums2017)


def _hu_pair(t: Table) -> list[int]:
    return t.find_household(2)


# -- header / columns ----------------------------------------------------------------------
@builder
def build_missing_column(tmp: Path) -> Broken:
    t = base_2018()
    j = t.col("AGEP")
    t.header.pop(j)
    for r in t.rows:
        r.pop(j)
    msg = "missing column AGEP (required by the domain spec, layout pums2017)"
    return Broken(t.write(tmp / CSV), CSV, "columns", 1, "AGEP", msg, ("missing column", "AGEP"))


@builder
def build_unknown_column(tmp: Path) -> Broken:
    t = base_2018()
    t.header.append(b"XYZW")
    for r in t.rows:
        r.append(b"7")
    msg = "unexpected column 'XYZW': not a PUMS person variable of layout pums2017"
    return Broken(t.write(tmp / CSV), CSV, "columns", 1, "XYZW", msg, ("unexpected column", "XYZW"))


@builder
def build_duplicate_column(tmp: Path) -> Broken:
    t = base_2018()
    j = t.col("PWGTP")
    t.header.insert(j + 1, b"PWGTP")
    for r in t.rows:
        r.insert(j + 1, r[j])
    msg = "duplicate column names ['PWGTP']"
    return Broken(t.write(tmp / CSV), CSV, "columns", 1, "PWGTP", msg, ("duplicate column", "PWGTP"))


@builder
def build_missing_header(tmp: Path) -> Broken:
    """The header line is missing: the first record is taken as the header. The reader must say
    so in one line without echoing that record's cells (a SERIALNO and confidential values)."""
    t = base_2018()
    first = [c.decode() for c in t.rows[0]]
    data = b"".join(b",".join(r) + b"\n" for r in t.rows)
    (tmp / CSV).write_bytes(data)
    secrets = tuple(sorted({v for v in first if len(v) >= 2}))
    msg = f"not a PUMS header (none of its {len(first)} names is a PUMS person variable): is the header line missing?"
    return Broken(tmp / CSV, CSV, "columns", 1, None, msg, ("header", "missing"), secrets)


def bom_header(tmp: Path) -> Path:
    """A valid file with a UTF-8 byte-order mark (as spreadsheet programs write): accepted."""
    t = base_2018()
    t.header[0] = b"\xef\xbb\xbf" + t.header[0]
    return t.write(tmp / CSV)


def padded_header(tmp: Path) -> Path:
    """A valid file whose header names carry surrounding spaces and quotes, as spreadsheet and
    database exports write them: accepted, read as the clean names."""
    t = base_2018()
    t.header = [b' "' + h + b'" ' if k % 2 else h + b" " for k, h in enumerate(t.header)]
    return t.write(tmp / CSV)


# -- cell values -----------------------------------------------------------------------------
def _cell(tmp: Path, i: int, col: str, value: str | bytes, check: str, msg: str, keywords: tuple[str, ...], secrets: tuple[str, ...] = ()) -> Broken:
    t = base_2018()
    old = t.get(i, col)
    serial = t.serial(i)
    t.set(i, col, value)
    return Broken(t.write(tmp / CSV), CSV, check, t.line(i), col, msg, keywords, (serial, *secrets, *((old,) if len(old) > 1 else ())))


@builder
def build_non_integer(tmp: Path) -> Broken:
    return _cell(tmp, 57, "AGEP", "4x7", "types", "not an integer: expected an integer 0..99", ("not an integer", "0..99"), ("4x7",))


@builder
def build_implausible_age(tmp: Path) -> Broken:
    return _cell(tmp, 73, "AGEP", "150", "values", "implausible value: expected an integer 0..99", ("implausible", "0..99"), ("150",))


@builder
def build_code_outside_dictionary(tmp: Path) -> Broken:
    return _cell(tmp, 101, "SEX", "3", "values", "code not in the data dictionary: expected one of the codes 1..2", ("data dictionary", "1..2"), ("3",))


@builder
def build_blank_required(tmp: Path) -> Broken:
    return _cell(tmp, 120, "CIT", "", "values", "blank value, expected one of the codes 1..5", ("blank value", "1..5"))


@builder
def build_blank_serialno(tmp: Path) -> Broken:
    return _cell(tmp, 11, "SERIALNO", "", "values", "empty identifier (expected a SERIALNO)", ("empty identifier", "SERIALNO"))


@builder
def build_sporder_zero(tmp: Path) -> Broken:
    return _cell(tmp, 3, "SPORDER", "00", "values", "implausible value: expected an integer 1..99", ("implausible", "1..99"))


@builder
def build_non_utf8(tmp: Path) -> Broken:
    t = base_2018()
    i, col = 88, "AGEP"
    serial = t.serial(i)
    t.set(i, col, t.rows[i][t.col(col)] + b"\xff")
    data = t.to_bytes()
    offset = data.index(b"\xff")
    (tmp / CSV).write_bytes(data)
    msg = f"bytes that are not valid UTF-8 (byte offset {offset})"
    return Broken(tmp / CSV, CSV, "encoding", t.line(i), col, msg, ("not valid UTF-8",), (serial,))


@builder
def build_non_utf8_header(tmp: Path) -> Broken:
    t = base_2018()
    t.header[t.col("AGEP")] = b"AG\xe9P"
    msg = "the header line is not valid UTF-8 text"
    return Broken(t.write(tmp / CSV), CSV, "encoding", 1, None, msg, ("header", "not valid UTF-8"))


@builder
def build_exponent_notation_age(tmp: Path) -> Broken:
    """'5e1' is not an integer as PUMS writes them (a spreadsheet's rendering of 50): refused."""
    return _cell(tmp, 57, "AGEP", "5e1", "types", "not an integer: expected an integer 0..99", ("not an integer",), ("5e1",))


@builder
def build_non_ascii_digit_age(tmp: Path) -> Broken:
    """'٣٧' (Arabic-Indic digits, which Python's int() would read as 37) is not an integer as PUMS
    writes them: refused, as any field that is not ASCII digits."""
    return _cell(tmp, 57, "AGEP", "\u0663\u0667", "types", "not an integer: expected an integer 0..99", ("not an integer",), ("\u0663\u0667",))


# -- rows ----------------------------------------------------------------------------------
@builder
def build_short_row(tmp: Path) -> Broken:
    t = base_2018()
    i = 150
    serial = t.serial(i)
    n = len(t.header)
    t.rows[i] = t.rows[i][: n - 6]
    msg = f"expected {n} fields, got {n - 6} (truncated or malformed row)"
    return Broken(t.write(tmp / CSV), CSV, "row", t.line(i), None, msg, ("expected", "fields", "truncated"), (serial,))


@builder
def build_long_row(tmp: Path) -> Broken:
    t = base_2018()
    i = 33
    n = len(t.header)
    t.rows[i] = t.rows[i] + [b"1", b"2"]
    msg = f"expected {n} fields, got {n + 2} (truncated or malformed row)"
    return Broken(t.write(tmp / CSV), CSV, "row", t.line(i), None, msg, ("expected", "fields"), (t.serial(i),))


@builder
def build_truncated_file(tmp: Path) -> Broken:
    """The file ends in the middle of its last record (interrupted download)."""
    t = base_2018()
    data = t.to_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut = data[: last_start + 40]  # 40 bytes into the last record (no final newline)
    k = cut[last_start:].count(b",") + 1
    (tmp / CSV).write_bytes(cut)
    n = len(t.header)
    msg = f"expected {n} fields, got {k} (truncated or malformed row)"
    return Broken(tmp / CSV, CSV, "row", t.line(len(t.rows) - 1), None, msg, ("truncated",), (t.serial(len(t.rows) - 1),))


@builder
def build_blank_line_shifts_lines(tmp: Path) -> Broken:
    """An empty line between records: the value error below it must name its real line."""
    t = base_2018()
    i = 60
    serial = t.serial(i)
    t.set(i, "AGEP", "150")
    data = t.to_bytes()
    lines = data.split(b"\n")
    lines.insert(11, b"")  # blank physical line 12
    (tmp / CSV).write_bytes(b"\n".join(lines))
    return Broken(tmp / CSV, CSV, "values", t.line(i) + 1, "AGEP", "implausible value: expected an integer 0..99", ("implausible",), (serial, "150"))


# -- households ------------------------------------------------------------------------------
@builder
def build_duplicate_person(tmp: Path) -> Broken:
    t = base_2018()
    a, b = _hu_pair(t)  # householder, second person
    serial = t.serial(a)
    t.rows.insert(b + 1, list(t.rows[b]))  # the second person appears twice
    msg = "duplicate person (SERIALNO, SPORDER): the same person number appears twice in one household"
    return Broken(t.write(tmp / CSV), CSV, "households", t.line(b + 1), "SPORDER", msg, ("duplicate person", "SPORDER"), (serial,))


@builder
def build_no_householder(tmp: Path) -> Broken:
    t = base_2018()
    a, b = _hu_pair(t)
    assert t.get(a, "RELP") == "00"
    t.set(a, "RELP", "01")
    msg = "household without a householder (no person with RELP 00)"
    return Broken(t.write(tmp / CSV), CSV, "households", t.line(a), "RELP", msg, ("without a householder", "RELP"), (t.serial(a),))


@builder
def build_two_householders(tmp: Path) -> Broken:
    t = base_2018()
    a, b = _hu_pair(t)
    assert t.get(b, "RELP") != "00"
    t.set(b, "RELP", "00")
    msg = "household with more than one householder (RELP 00)"
    # the line is the household's first person (the reader locates households, not persons)
    return Broken(t.write(tmp / CSV), CSV, "households", t.line(a), "RELP", msg, ("more than one householder",), (t.serial(a),))


@builder
def build_gq_serial_relp_mismatch(tmp: Path) -> Broken:
    t = base_2018()
    (i,) = t.find_household(1, gq=True)
    assert t.serial(i)[4:6] == "GQ"
    t.set(i, "RELP", "00")  # a housing-unit householder with a group-quarters serial number
    msg = "relationship code and SERIALNO disagree on group quarters (RELP [16, 17] must go with a GQ serial number)"
    return Broken(t.write(tmp / CSV), CSV, "households", t.line(i), "RELP", msg, ("group quarters", "GQ serial"), (t.serial(i),))


@builder
def build_puma_differs_in_household(tmp: Path) -> Broken:
    t = base_2018()
    a, b = _hu_pair(t)
    old = t.get(b, "PUMA")
    new = next(p for p in ("00100", "00200", "00300", "00400") if p != old)
    t.set(b, "PUMA", new)
    msg = "persons of one household have different PUMA codes"
    return Broken(t.write(tmp / CSV), CSV, "households", t.line(a), "PUMA", msg, ("different PUMA",), (t.serial(a), old, new))


# -- files and archives ----------------------------------------------------------------------
@builder
def build_empty_file(tmp: Path) -> Broken:
    (tmp / CSV).write_bytes(b"")
    return Broken(tmp / CSV, CSV, "file", None, None, "file is empty (0 bytes)", ("empty", "0 bytes"))


@builder
def build_header_only(tmp: Path) -> Broken:
    t = base_2018()
    t.rows = []
    msg = "no person records after the header"
    return Broken(t.write(tmp / CSV), CSV, "file", 1, None, msg, ("no person records",))


@builder
def build_zip_empty_member(tmp: Path) -> Broken:
    p = write_zip(tmp / "csv_pvt.zip", {VT_MEMBER: b""})
    return Broken(p, f"csv_pvt.zip:{VT_MEMBER}", "file", None, None, "file is empty (0 bytes)", ("empty",))


@builder
def build_zip_without_person_member(tmp: Path) -> Broken:
    """The real archive with its person CSV removed (only the PDF readme left)."""
    with zipfile.ZipFile(VT_ZIP) as zf:
        others = {n: zf.read(n) for n in zf.namelist() if n != VT_MEMBER}
    p = write_zip(tmp / "csv_pvt.zip", others)
    msg = f"no person CSV member among {list(others)}: expected {ONE_PERSON_MEMBER}"
    return Broken(p, "csv_pvt.zip", "zip", None, None, msg, ("no person CSV member", "psam_pNN.csv"))


@builder
def build_zip_two_person_members(tmp: Path) -> Broken:
    data = base_2018().to_bytes()
    p = write_zip(tmp / "csv_pvt.zip", {VT_MEMBER: data, "psam_p10.csv": data})
    msg = f"2 CSV members {[VT_MEMBER, 'psam_p10.csv']}: expected {ONE_PERSON_MEMBER}; PDF and text members are ignored"
    return Broken(p, "csv_pvt.zip", "zip", None, None, msg, ("2 CSV members", "exactly one"))


@builder
def build_zip_person_member_and_other_csv(tmp: Path) -> Broken:
    """The real archive with an edited copy of its person CSV added: which one was meant is a guess."""
    with zipfile.ZipFile(VT_ZIP) as zf:
        readme = {n: zf.read(n) for n in zf.namelist() if n != VT_MEMBER}
    data = base_2018().to_bytes()
    p = write_zip(tmp / "csv_pvt.zip", {VT_MEMBER: data, **readme, "psam_p50_edited.csv": data})
    msg = f"2 CSV members {[VT_MEMBER, 'psam_p50_edited.csv']}: expected {ONE_PERSON_MEMBER}; PDF and text members are ignored"
    return Broken(p, "csv_pvt.zip", "zip", None, None, msg, ("2 CSV members", "psam_p50_edited.csv"))


NOT_PLAIN = "expected the Census .zip archive (csv_pXX.zip) or a plain CSV"


def _compressed(tmp: Path, file: str, compress: Callable[[bytes], bytes], kind: str) -> Broken:
    p = tmp / file
    p.write_bytes(compress(base_2018().to_bytes()))
    msg = f"{kind}-compressed data: {NOT_PLAIN} (decompress it first)"
    return Broken(p, file, "file", None, None, msg, (kind, "plain CSV"))


@builder
def build_gzip_file(tmp: Path) -> Broken:
    return _compressed(tmp, CSV + ".gz", gzip.compress, "gzip")


@builder
def build_gzip_named_csv(tmp: Path) -> Broken:
    return _compressed(tmp, CSV, gzip.compress, "gzip")


@builder
def build_bzip2_named_csv(tmp: Path) -> Broken:
    return _compressed(tmp, CSV, bz2.compress, "bzip2")


@builder
def build_xz_named_zip(tmp: Path) -> Broken:
    return _compressed(tmp, "csv_pvt.zip", lzma.compress, "xz")


@builder
def build_zip_named_csv(tmp: Path) -> Broken:
    p = write_zip(tmp / CSV, {VT_MEMBER: base_2018().to_bytes()})
    msg = f"a zip archive named .csv: {NOT_PLAIN} (name the archive .zip)"
    return Broken(p, CSV, "file", None, None, msg, ("zip archive", ".zip"))


@builder
def build_workbook(tmp: Path) -> Broken:
    """A spreadsheet workbook (a zip container) given where a CSV is expected."""
    p = write_zip(tmp / "psam_p50.xlsx", {"xl/worksheets/sheet1.csv": base_2018().to_bytes()})
    msg = f"a spreadsheet workbook: {NOT_PLAIN} (save the sheet as CSV)"
    return Broken(p, "psam_p50.xlsx", "file", None, None, msg, ("spreadsheet", "CSV"))


@builder
def build_truncated_zip(tmp: Path) -> Broken:
    full = write_zip(tmp / "full.zip", {VT_MEMBER: base_2018().to_bytes()})
    raw = full.read_bytes()
    full.unlink()
    p = tmp / "csv_pvt.zip"
    p.write_bytes(raw[: len(raw) // 2])
    msg = "not a readable zip archive (corrupt or truncated file)"
    return Broken(p, "csv_pvt.zip", "zip", None, None, msg, ("not a readable zip", "truncated"))


@builder
def build_zip_member_crc(tmp: Path) -> Broken:
    """A stored (uncompressed) member with one digit changed: decompression works, CRC fails."""
    p = write_zip(tmp / "csv_pvt.zip", {VT_MEMBER: base_2018().to_bytes()}, compression=zipfile.ZIP_STORED)
    start, end = member_data_span(p, VT_MEMBER)
    raw = bytearray(p.read_bytes())
    k = raw.index(b"\n", start) + 100  # somewhere in the first record
    raw[k] = ord("7") if raw[k] != ord("7") else ord("8")
    p.write_bytes(bytes(raw))
    msg = "corrupt zip member (CRC check failed): the archive is damaged or truncated"
    return Broken(p, f"csv_pvt.zip:{VT_MEMBER}", "zip", None, None, msg, ("corrupt zip member", "CRC"))


@builder
def build_zip_member_flipped(tmp: Path) -> Broken:
    """A deflated member with 32 bytes inverted in the middle of its compressed data."""
    p = write_zip(tmp / "csv_pvt.zip", {VT_MEMBER: base_2018().to_bytes()})
    start, end = member_data_span(p, VT_MEMBER)
    raw = bytearray(p.read_bytes())
    mid = (start + end) // 2
    for k in range(mid, mid + 32):
        raw[k] ^= 0xFF
    p.write_bytes(bytes(raw))
    # zlib either rejects the stream or inflates garbage that fails the CRC: both are fine
    msg = "corrupt zip member (CRC check failed): the archive is damaged or truncated"
    return Broken(
        p, f"csv_pvt.zip:{VT_MEMBER}", "zip", None, None, msg, ("corrupt zip member",),
        extra={"alternatives": ("corrupt zip member (cannot be decompressed): the archive is damaged or truncated",)},
    )


@builder
def build_zip_member_bad_deflate(tmp: Path) -> Broken:
    """A deflated member whose first block header names the reserved block type 11: zlib refuses it."""
    p = write_zip(tmp / "csv_pvt.zip", {VT_MEMBER: base_2018().to_bytes()})
    start, _ = member_data_span(p, VT_MEMBER)
    raw = bytearray(p.read_bytes())
    raw[start] |= 0b110  # BTYPE bits (1-2) of the first block header
    p.write_bytes(bytes(raw))
    msg = "corrupt zip member (cannot be decompressed): the archive is damaged or truncated"
    return Broken(p, f"csv_pvt.zip:{VT_MEMBER}", "zip", None, None, msg, ("corrupt zip member", "decompressed"))


# -- legacy (pre-2017) layout ----------------------------------------------------------------
LEGACY_CSV, LEGACY_HCSV = "ss13pde.csv", "ss13hde.csv"


@builder
def build_legacy_housing_np_mismatch(tmp: Path) -> Broken:
    persons, housing = base_legacy()
    hh = persons.households()
    serial = next(s for s, idx in hh.items() if len(idx) == 3 and len(s) >= 4)
    h_rows = {housing.serial(i): i for i in range(len(housing.rows))}
    j = h_rows[serial]
    assert housing.get(j, "NP") == "3"
    housing.set(j, "NP", "4")
    p = persons.write(tmp / LEGACY_CSV)
    h = housing.write(tmp / LEGACY_HCSV)
    msg = "NP of the housing record differs from the number of persons in the person file"
    return Broken(p, LEGACY_HCSV, "housing", housing.line(j), "NP", msg, ("NP", "differs"), (serial,), housing=h, domain=CORE)


@builder
def build_legacy_housing_blank_line_shifts_lines(tmp: Path) -> Broken:
    """The NP mismatch above with an empty line after the housing header: its real line is named."""
    b = build_legacy_housing_np_mismatch(tmp)
    assert b.housing is not None and b.line is not None
    lines = b.housing.read_bytes().split(b"\n")
    lines.insert(1, b"")  # blank physical line 2
    b.housing.write_bytes(b"\n".join(lines))
    return replace(b, line=b.line + 1)


@builder
def build_legacy_na_in_required(tmp: Path) -> Broken:
    persons, housing = base_legacy()
    i = 77
    serial = persons.serial(i)
    persons.set(i, "AGEP", "NA")
    p = persons.write(tmp / LEGACY_CSV)
    h = housing.write(tmp / LEGACY_HCSV)
    msg = "blank value, expected an integer 0..99"
    return Broken(p, LEGACY_CSV, "values", persons.line(i), "AGEP", msg, ("blank value",), (serial,), housing=h, domain=CORE)


@builder
def build_legacy_person_without_housing_record(tmp: Path) -> Broken:
    persons, housing = base_legacy()
    s = housing.col("SERIALNO")
    serial = persons.serial(200)
    housing.rows = [r for r in housing.rows if r[s].decode() != serial]
    p = persons.write(tmp / LEGACY_CSV)
    h = housing.write(tmp / LEGACY_HCSV)
    msg = "persons whose SERIALNO has no housing record"
    return Broken(p, LEGACY_HCSV, "housing", None, None, msg, ("no housing record",), (serial,), housing=h, domain=CORE)


@builder
def build_legacy_as_pums2017(tmp: Path) -> Broken:
    """A 2013 file given the 2017+ column set (no R index, SPORDER added), read as pums2017:
    only the SERIALNO form (no year prefix, no HU/GQ) betrays it."""
    persons, _ = base_legacy()
    j = persons.col("")
    sp = []
    prev, k = None, 0
    for i in range(len(persons.rows)):
        k = k + 1 if persons.serial(i) == prev else 1
        prev = persons.serial(i)
        sp.append(str(k).encode())
    header = [h for c, h in enumerate(persons.header) if c != j] + [b"SPORDER"]
    rows = [[b"" if v == b"NA" else v for c, v in enumerate(r) if c != j] + [o] for r, o in zip(persons.rows, sp)]
    t = Table(header, rows)
    p = t.write(tmp / "psam_p10.csv")
    msg = "SERIALNO does not have the 2017+ form YYYYHU… or YYYYGQ… (is this a pre-2017 file? set layout: pums_legacy)"
    return Broken(p, "psam_p10.csv", "households", 2, "SERIALNO", msg, ("2017+ form", "pums_legacy"), (t.serial(0),), count=len(rows), layout="pums2017", domain=CORE)


@builder
def build_legacy_file_read_as_pums2017(tmp: Path) -> Broken:
    """The 2013 R export as it is, read with layout pums2017: its two column findings (no SPORDER,
    an unnamed row-index column) have one cause, reported once: a pre-2017 file."""
    persons, _ = base_legacy()
    p = persons.write(tmp / LEGACY_CSV)
    msg = "no SPORDER column and an unnamed first column (a row index), as in a pre-2017 file: expected the pums2017 header, or set layout: pums_legacy"
    return Broken(p, LEGACY_CSV, "columns", 1, "SPORDER", msg, ("pre-2017", "pums_legacy"), (persons.serial(0),), layout="pums2017", domain=CORE)


@builder
def build_legacy_housing_duplicate_serial(tmp: Path) -> Broken:
    """A housing record appearing twice: its second line is named."""
    persons, housing = base_legacy()
    j = 5
    housing.rows.insert(j + 1, list(housing.rows[j]))
    p = persons.write(tmp / LEGACY_CSV)
    h = housing.write(tmp / LEGACY_HCSV)
    msg = "duplicate SERIALNO in the housing file (one record per unit expected)"
    return Broken(p, LEGACY_HCSV, "housing", housing.line(j + 1), "SERIALNO", msg, ("duplicate SERIALNO",), (housing.serial(j),), housing=h, domain=CORE)
