"""The scan for confidential values (tests/confidential_scan.py) on synthetic Prefect database rows
and files: it finds each kind of leak it searches for, and numbers that only look alike are not
taken for one. The end-to-end scan of a real run is in tests/test_release_flow.py."""

import base64
import json
import pickle
import sqlite3

from tests.confidential_scan import Needles, findings, scan_database, scan_files, scan_prefect_home
from tests.test_release_flow import small_config

PUMAS = {(50, 100): 640, (50, 200): 756, (50, 300): 627, (50, 400): 691}
NEEDLES = Needles(hashes=("e3" * 32,), puma_counts=tuple(PUMAS.values()), totals=frozenset({2714, 6436}))


def database(path, rows: list[tuple[str, str | bytes]]):
    """A SQLite file shaped like Prefect's: a flow_run table (parameters as JSON text) and a log
    table (message text), one row each."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE flow_run (id TEXT, parameters TEXT, state BLOB)")
    con.execute("CREATE TABLE log (id TEXT, message TEXT)")
    for table, value in rows:
        col = {"flow_run": "parameters", "log": "message"}[table]
        con.execute(f"INSERT INTO {table} (id, {col}) VALUES (?, ?)", ("3f2a2714-6436-4abc-8def-000000002714", value))
    con.commit()
    con.close()
    return path


def test_the_ingest_record_reaching_prefect_holds_no_hash_and_the_scan_finds_one_put_back(tmp_path, data_root):
    """The record an ingest task returns (a task result, then a subflow parameter) names the input
    by role and paths only; put the file's plain SHA-256 back into it, as the ingest task once did,
    and the database scan reports it."""
    from schemas.release_config import load_config
    from tasks.ingest import ingest_input, read_report
    from tasks.run_context import prepare

    cfg = load_config(small_config(tmp_path, data_root))
    paths = prepare(cfg.run_dir(), cfg.release_dir())
    record = ingest_input.fn(cfg, paths, "private", 0)
    assert set(record) == {"role", "path", "encoded", "report"}
    report = read_report(record)
    needles = Needles.of_private_input(paths.run_dir, published={}, published_totals=set())
    assert needles.hashes == (report["sha256"],) and len(needles.puma_counts) == 4 and report["households_encoded"] in needles.totals
    clean = database(tmp_path / "clean.db", [("flow_run", json.dumps({"reports": [record]}))])
    assert scan_database(clean, needles) == []
    leaky = database(tmp_path / "leaky.db", [("flow_run", json.dumps({"reports": [{**record, "sha256": report["sha256"]}]}))])
    assert scan_database(leaky, needles) == ["leaky.db: flow_run.parameters: a private input's plain SHA-256"]


def test_the_scan_finds_each_kind_of_leak_in_database_rows_and_files(tmp_path):
    per_node = {f"ST={st}/PUMA={pu}": n for (st, pu), n in PUMAS.items()}
    leaks = [
        ("flow_run", json.dumps({"counts": per_node})),
        ("flow_run", json.dumps({"rows": [{"node": k, "households": n} for k, n in per_node.items()]})),
        ("flow_run", json.dumps([list(PUMAS.values())])),
        ("log", "PUMA households: 627, 640, 691 and 756"),
        ("log", '{"households": 2714}'),
        ("log", "persons read: 6436"),
        ("log", ("E3" * 32).encode()),
    ]
    for i, row in enumerate(leaks):
        assert scan_database(database(tmp_path / f"{i}.db", [row]), NEEDLES), row
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps({"pumas": per_node}, indent=2))
    jsonl = tmp_path / "audit.jsonl"
    jsonl.write_text("\n".join(json.dumps({"event": "x", "node": k, "households": n}) for k, n in per_node.items()))
    parquet_like = tmp_path / "table.parquet"
    parquet_like.write_bytes(b"PAR1\xff\x00" + ("e3" * 32).encode() + b"\x00\xfe")
    found = scan_files([pretty, parquet_like], NEEDLES)
    assert found == [f"{pretty}: the exact per-PUMA household counts of the private input",
                     f"{parquet_like}: a private input's plain SHA-256"]
    # one event per line, each with one count: no line holds the group
    assert scan_files([jsonl], NEEDLES) == []


def test_numbers_that_only_look_like_the_confidential_ones_are_not_leaks(tmp_path):
    """Identifiers, hashes, dates, fractions and zero-padded codes that contain the digits of a
    total, a single PUMA count and counts spread over separate lines are not taken for a leak."""
    benign = [
        ("log", "run 3f2a2714-6436-4abc-8def-000000002714 at 2714-06-27T10:00:00"),
        ("log", "rho 0.2714, code 02714, key a2714b, file ST50_PUMA6436.npz, range 2714-6436"),
        ("log", "PUMA 100: 640 households"),
        ("flow_run", json.dumps({"a": [640, 756], "b": {"c": {"d": [627, 691]}}})),
        ("flow_run", json.dumps({"households": 2713, "persons": 64360})),
    ]
    assert scan_database(database(tmp_path / "benign.db", benign), NEEDLES) == []
    assert findings("binary", b"\xff\xfe 2714 640 756 627 691", NEEDLES) == []  # not text: hash only


def test_an_html_page_is_searched_per_element_and_per_embedded_json(tmp_path):
    """A page on one line (as report.html writes its sections and embedded tables) whose elements
    hold the counts apart is no leak; an element's text, or the JSON a script embeds, holding
    them together is."""
    counts = list(PUMAS.values())
    cells = "".join(f"<td>{n}</td>" for n in counts)
    page = tmp_path / "report.html"
    page.write_text(f"<!DOCTYPE html><html><body><table><tr>{cells}</tr></table></body></html>")
    assert scan_files([page], NEEDLES) == []
    leaks = {"text.html": f"<!DOCTYPE html><html><p>households {', '.join(map(str, counts))}</p></html>",
             "json.html": "<!DOCTYPE html><html><script type=\"application/json\">"
                          + json.dumps({"nodes": [{"households": n} for n in counts]}) + "</script></html>"}
    for name, text in leaks.items():
        (tmp_path / name).write_text(text)
        assert scan_files([tmp_path / name], NEEDLES) == [f"{tmp_path / name}: the exact per-PUMA household counts of the private input"]


def test_counts_the_release_publishes_are_left_out_of_the_search(tmp_path, data_root):
    """A per-PUMA count or a total equal to the noisy one the release publishes is no needle:
    the published number cannot be told from the confidential one."""
    from schemas.release_config import load_config
    from tasks.ingest import ingest_input, read_report
    from tasks.run_context import prepare

    cfg = load_config(small_config(tmp_path, data_root))
    paths = prepare(cfg.run_dir(), cfg.release_dir())
    report = read_report(ingest_input.fn(cfg, paths, "private", 0))
    full = Needles.of_private_input(paths.run_dir, published={}, published_totals=set())
    node, n = (50, 100), full.puma_counts[0]
    less = Needles.of_private_input(paths.run_dir, published={node: n}, published_totals={report["households_encoded"]})
    assert less.puma_counts == full.puma_counts[1:]
    assert less.totals == full.totals - {report["households_encoded"]}


def test_rows_of_other_release_runs_are_left_out_and_rows_of_this_one_are_not(tmp_path):
    """In the test session's shared Prefect database, rows naming only another release's runs are
    skipped (its noisy counts may equal this input's exact ones); rows of this release's runs —
    the top-level run, a subflow run below it, their task runs — and rows naming no run are scanned."""
    mine, sub, task, other = (f"{i:08x}-0000-4000-8000-000000000000" for i in range(1, 5))
    db = tmp_path / "prefect.db"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE flow_run (id TEXT, parameters TEXT, parent_task_run_id TEXT)")
    con.execute("CREATE TABLE task_run (id TEXT, flow_run_id TEXT)")
    con.execute("CREATE TABLE log (flow_run_id TEXT, task_run_id TEXT, message TEXT)")
    con.executemany("INSERT INTO flow_run VALUES (?, ?, ?)", [(mine, json.dumps({"config_path": "/a/release.yaml"}), None),
                                                             (sub, "{}", task), (other, json.dumps({"config_path": "/b/release.yaml"}), None)])
    con.execute("INSERT INTO task_run VALUES (?, ?)", (task, mine))
    con.execute("INSERT INTO log VALUES (?, NULL, 'published 2714 synthetic households')", (other,))
    con.commit()
    assert scan_database(db, NEEDLES, "/a/release.yaml") == []
    assert scan_database(db, NEEDLES) == ["prefect.db: log.message: an exact total of the private input"]  # no filter: found
    for row in [(sub, None), (None, task), (None, None)]:
        con.execute("INSERT INTO log VALUES (?, ?, 'persons read: 6436')", row)
        con.commit()
        assert scan_database(db, NEEDLES, "/a/release.yaml") == ["prefect.db: log.message: an exact total of the private input"], row
        con.execute("DELETE FROM log WHERE message LIKE 'persons%'")
        con.commit()
    con.close()


def test_a_stored_result_is_read_as_the_object_it_holds(tmp_path):
    """Prefect keeps a failed run's exception (and any persisted result) as base64 of a pickle in
    its result storage: the scan reads the exception's text, not the base64."""
    storage = tmp_path / "storage"
    storage.mkdir()
    (storage / "a").write_bytes(base64.encodebytes(pickle.dumps(RuntimeError("6436 persons read " + "x" * 100))))  # in lines, as Prefect writes
    (storage / "b").write_text(json.dumps({"metadata": {}, "result": base64.b64encode(pickle.dumps(["e3" * 32])).decode()}))
    (storage / "c").write_bytes(base64.b64encode(pickle.dumps(RuntimeError("nothing confidential"))))
    assert scan_prefect_home(tmp_path, NEEDLES) == ([f"{storage / 'a'} (stored result): an exact total of the private input",
                                                     f"{storage / 'b'} (stored result): a private input's plain SHA-256"], 3)
