"""Validation of PUMS person files: broken inputs cut from the real Census files must each be
rejected with exactly one precise issue (check kind, line, column, message) and one
``INVALID …`` line from ``dprelease validate`` (exit 1); the real files must validate; no message
may carry a SERIALNO or a cell value.

The broken inputs are built by ``tests/broken_inputs.py`` (a few hundred records each, in tmp_path).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:  # tests/ as a package (tests/__init__.py) or as a plain rootdir-inserted folder
    from tests import broken_inputs as bi
except ImportError:  # pragma: no cover
    import broken_inputs as bi
from flows.cli import main
from schemas.domain_spec import load_domain_spec
from schemas.pums_reader import InputError, read_person_file

pytestmark = pytest.mark.skipif(not bi.data_available(), reason=f"shared PUMS data missing at {bi.DATA}")

NAMES = sorted(bi.BUILDERS)

# the shared 2018 files: zip -> (persons, units)
REAL_2018 = {
    "csv_pde.zip": (9123, 4166), "csv_pid.zip": (16711, 6978), "csv_pme.zip": (13275, 6391),
    "csv_pmt.zip": (10336, 4738), "csv_pnd.zip": (7876, 3646), "csv_pne.zip": (19451, 8774),
    "csv_pnh.zip": (13780, 6318), "csv_pnm.zip": (19247, 8706), "csv_pri.zip": (10489, 4989),
    "csv_psd.zip": (8986, 4023), "csv_pvt.zip": (6436, 3130), "csv_pwy.zip": (5740, 2572),
}  # fmt: skip


def _issues(b: bi.Broken, spec) -> list:
    """The reader's issues for ``b``, read with ``spec`` (the default domain) or the spec ``b``
    names (the 2013 extract's)."""
    with pytest.raises(InputError) as ei:
        read_person_file(b.path, spec if b.domain == "acs_pums" else b.spec(), **b.read_kwargs())
    return ei.value.issues


def _text(issue) -> str:
    """What an issue says beyond its location (file and line numbers are not data)."""
    return f"{issue.column or ''} {issue.message}"


def _leaks(text: str, secrets) -> list[str]:
    """Confidential values found in ``text``: 2017+ SERIALNOs, and the given values as tokens."""
    found = bi.SERIAL_2017_RE.findall(text)
    for s in secrets:
        if s and re.search(rf"(?<![0-9A-Za-z]){re.escape(s)}(?![0-9A-Za-z])", text):
            found.append(s)
    return found


# -- the samples the broken inputs start from are valid ------------------------------------
def test_at_least_18_broken_inputs():
    assert len(bi.BUILDERS) >= 18


def test_base_samples_are_valid(tmp_path, domain_spec):
    t = bi.base_2018()
    n_gq = sum(t.serial(i)[4:6] == "GQ" for i in range(len(t.rows)))
    assert n_gq == bi.N_GQ and len(t.rows) >= bi.N_GQ + bi.N_HU
    got = read_person_file(t.write(tmp_path / bi.CSV), domain_spec)
    assert (len(got.line), got.layout) == (len(t.rows), "pums2017")

    csv_zip = bi.write_zip(tmp_path / "csv_pvt.zip", {bi.VT_MEMBER: t.to_bytes()})
    assert read_person_file(csv_zip, domain_spec).name == f"csv_pvt.zip:{bi.VT_MEMBER}"

    persons, housing = bi.base_legacy()
    p, h = persons.write(tmp_path / "ss13pde.csv"), housing.write(tmp_path / "ss13hde.csv")
    got = read_person_file(p, load_domain_spec(bi.CORE), housing=h)
    assert (len(got.line), got.layout) == (len(persons.rows), "pums_legacy")
    assert got.vacant_units > 0  # the housing cut keeps vacant units (NP 0)


# -- each broken input: one precise issue ----------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_reader_reports_the_issue(name, tmp_path, domain_spec):
    b = bi.BUILDERS[name](tmp_path)
    issues = _issues(b, domain_spec)
    assert len(issues) == 1, [str(i) for i in issues]
    (issue,) = issues
    messages = [b.message, *b.extra.get("alternatives", ())]
    assert (issue.check, issue.file, issue.line, issue.column, issue.count) == (b.check, b.file, b.line, b.column, b.count)
    assert issue.message in messages
    for word in b.keywords:
        assert word.lower() in issue.message.lower(), (word, issue.message)


@pytest.mark.parametrize("name", NAMES)
def test_cli_prints_one_line_and_fails(name, tmp_path, capsys):
    b = bi.BUILDERS[name](tmp_path)
    rc = main(b.cli_args())
    out = capsys.readouterr().out
    expected = [b.expected_output()] + [b.expected_output().replace(b.message, m) for m in b.extra.get("alternatives", ())]
    assert rc == 1
    assert out in expected, out


@pytest.mark.parametrize("name", NAMES)
def test_messages_carry_no_confidential_value(name, tmp_path, domain_spec):
    """Privacy: messages locate a problem by line and column only, never by its value."""
    b = bi.BUILDERS[name](tmp_path)
    for issue in _issues(b, domain_spec):
        assert not _leaks(_text(issue), b.secrets), str(issue)


def test_cli_checks_every_file_and_reports_each(tmp_path, capsys):
    """Several inputs: every broken one gets its line, the valid one its OK line, exit 1."""
    (tmp_path / "a").mkdir()
    (tmp_path / "c").mkdir()
    a = bi.build_implausible_age(tmp_path / "a")
    c = bi.build_code_outside_dictionary(tmp_path / "c")
    rc = main(["validate", str(a.path), str(bi.VT_ZIP), str(c.path)])
    lines = capsys.readouterr().out.splitlines(keepends=True)
    assert rc == 1
    assert lines[0] == a.expected_output() and lines[2] == c.expected_output()
    assert lines[1].startswith(f"OK csv_pvt.zip:{bi.VT_MEMBER}: 6436 person records, 3130 units")


def test_installed_command_exit_code_and_stdout(tmp_path):
    exe = Path(sys.executable).with_name("dprelease")
    exe = str(exe) if exe.exists() else shutil.which("dprelease")
    assert exe, "the dprelease console script is not installed"
    b = bi.build_two_householders(tmp_path)
    r = subprocess.run([exe, *b.cli_args()], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert r.stdout == b.expected_output()
    assert "Traceback" not in r.stderr


# -- the real files validate ---------------------------------------------------------------
def test_all_real_2018_zips_validate(capsys):
    zips = [bi.ACS2018 / z for z in sorted(REAL_2018)]
    assert main(["validate", *map(str, zips)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 12
    for line, z in zip(out, sorted(REAL_2018)):
        persons, units = REAL_2018[z]
        assert re.fullmatch(rf"OK {z}:psam_p\d\d\.csv: {persons} person records, {units} units, layout pums2017", line), line


def test_real_2013_delaware_pair_validates(capsys):
    rc = main(["validate", str(bi.LEGACY_P), "--housing", str(bi.LEGACY_H), "--domain", "acs_pums_core"])
    assert rc == 0
    assert capsys.readouterr().out == "OK ss13pde.csv: 8767 person records, 3873 units, layout pums_legacy\n"


def _same_persons(a, b) -> bool:
    return a.cols.keys() == b.cols.keys() and all((a.cols[c] == b.cols[c]).all() for c in a.cols)


def test_byte_order_mark_is_accepted(tmp_path, domain_spec):
    t = read_person_file(bi.bom_header(tmp_path), domain_spec)
    assert len(t.line) > 0 and "SERIALNO" not in t.cols


def test_padded_header_names_read_as_the_clean_names(tmp_path, domain_spec):
    (tmp_path / "clean").mkdir()
    clean = read_person_file(bi.base_2018().write(tmp_path / "clean" / bi.CSV), domain_spec)
    padded = read_person_file(bi.padded_header(tmp_path), domain_spec)
    assert _same_persons(padded, clean) and (padded.line == clean.line).all()


def test_zip_ignores_readme_folders_and_macos_forks(tmp_path, domain_spec):
    """A Census archive holds a PDF beside its CSV; one re-zipped on a Mac adds a folder entry and
    an AppleDouble '._' copy of every member, which is not a second CSV."""
    data = bi.base_2018().to_bytes()
    members = {f"csv_pvt/{bi.VT_MEMBER}": data, "ACS2018_PUMS_README.pdf": b"%PDF-1.4", "__MACOSX/": b"", f"__MACOSX/csv_pvt/._{bi.VT_MEMBER}": b"\x00\x05\x16\x07"}
    got = read_person_file(bi.write_zip(tmp_path / "csv_pvt.zip", members), domain_spec)
    assert got.name == f"csv_pvt.zip:csv_pvt/{bi.VT_MEMBER}" and len(got.line) == len(bi.base_2018().rows)


def test_an_issue_text_never_carries_the_count_of_records():
    """How many records of a confidential file share a problem is a count of that file: it stays in
    the structured issue (the owner-only validation record), not in the text that reaches the
    console, an exception or Prefect's database."""
    from schemas.pums_reader import InputIssue

    issue = InputIssue("csv_pvt.zip:psam_p50.csv", "implausible value: expected an integer 0..99", line=75, column="AGEP", count=1723)
    assert "1723" not in str(issue) and str(issue).endswith("(and more records like it)")
    assert issue.to_dict()["count"] == 1723
    assert not str(InputIssue("a.csv", "bad", line=2, column="SEX")).endswith("like it)")
