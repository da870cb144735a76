"""Scan what an operator can read after a run for values derived from the private input.

An operator reads Prefect's database (flow-run parameters, task-run states, logs, artifacts,
events: every table), Prefect's home (result storage, server logs), the console, the release
directory and the work directory's non-confidential files. None of them may hold:

- a private input's plain SHA-256 (hex): whoever knows every record of a file but one could
  confirm the missing one by hashing candidates; the manifest names private inputs by a keyed hash;
- the private input's exact per-PUMA household counts, searched as a group: every one of them
  among the integers of one JSON container (its items and its items' items: a list of counts, a
  {node: count} map or a list of {node, households} records) or of one line of plain text. One
  count alone is not searched: PUMA counts are a few hundred households, and numbers of that size
  turn up everywhere (ports, sizes, indices) without meaning anything;
- its exact totals (households and persons of the state and the nation, the ingest report's
  counts), searched alone only from 1000 up: a four-digit number standing as a whole token (not
  part of a word, a hash, an identifier or a date, not zero-padded) is rare enough in these texts
  that finding one is a leak, not a coincidence.

A confidential number that the release itself publishes as a noisy statistic (the noise can land
on the exact value) cannot be told from the published one: those are left out of the search
(:meth:`Needles.of_private_input`'s ``published``).

Binary content (parquet, npz, the database's own pages) is searched for the hash only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pickle
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# a whole decimal number: not inside a word, an identifier (UUID segments), a hash, a decimal
# fraction or a date (``2026-11-27``), never zero-padded (PUMA codes such as ``00640``)
_INTEGER = re.compile(r"(?<![\w.\-])(?:0|[1-9]\d*)(?![\w.\-])")
DISTINCTIVE = 1000

# the work directory's confidential files (exact counts, the plain hash, the private rows; the run's
# binding to its inputs' identities, which a resume compares): written owner-only and never
# published, so not searched
CONFIDENTIAL_WORK_FILES = ("inputs", "qa", "validation.json", "run_summary.json", "gx_inputs.json", "binding.json")


@dataclass(frozen=True)
class Needles:
    hashes: tuple[str, ...]
    puma_counts: tuple[int, ...]
    totals: frozenset[int]

    @classmethod
    def of_private_input(cls, work_dir: Path, published: dict[tuple[int, int], int], published_totals: set[int]) -> Needles:
        """The confidential values of a run's private inputs, from its work directory: the ingest
        reports (hash, counts) and the encoded private households (per-PUMA counts).
        ``published``: the release's household count per PUMA node (ST, PUMA); ``published_totals``:
        the release's other published counts (state, nation, persons)."""
        from engine.data._hierarchical_data import HierarchicalData

        reports = [json.loads(p.read_text()) for p in sorted((work_dir / "inputs").glob("private-[0-9]*.json"))]
        data = HierarchicalData.concat([HierarchicalData.from_npz(p) for p in sorted((work_dir / "inputs").glob("private-[0-9]*.npz"))])
        pumas, counts = np.unique(data.geo[:, :2], axis=0, return_counts=True)
        exact = {(int(st), int(pu)): int(n) for (st, pu), n in zip(pumas, counts)}
        _, per_state = np.unique(data.geo[:, 0], return_counts=True)
        totals = {int(v) for r in reports for v in r.values() if _is_int(v)}
        totals |= {data.n_households, data.n_persons, *(int(n) for n in per_state)}
        return cls(
            hashes=tuple(r["sha256"].lower() for r in reports),
            puma_counts=tuple(n for node, n in sorted(exact.items()) if published.get(node) != n),
            totals=frozenset(t for t in totals if t >= DISTINCTIVE and t not in published_totals),
        )


def integers(text: str) -> list[int]:
    return [int(m) for m in _INTEGER.findall(text)]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _json_groups(value) -> Iterator[list[int]]:
    """The integers of every JSON container (its items and its items' items), and those of every
    string in it read as text."""
    if isinstance(value, str):
        yield from number_groups(value)
        return
    items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
    if not items:
        return
    group = [v for v in items if _is_int(v)]
    for child in items:
        inner = list(child.values()) if isinstance(child, dict) else child if isinstance(child, list) else []
        group += [v for v in inner if _is_int(v)]
    yield group
    for child in items:
        yield from _json_groups(child)


def _parse_json(text: str):
    if not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


_TAG = re.compile(r"<[^>]*>")


def number_groups(text: str) -> Iterator[list[int]]:
    """Groups of integers that belong together: JSON containers (a whole JSON text, or a JSON
    line) or lines of plain text. An HTML page is read between its tags: one element's text, or
    the JSON a script element embeds, is a group; a line of it is not (``report.html`` holds its
    sections and its embedded tables on one line, thousands of numbers among which any few small
    counts turn up by chance)."""
    doc = _parse_json(text)
    if doc is not None:
        yield from _json_groups(doc)
        return
    html = text.lstrip()[:15].lower().startswith(("<!doctype html", "<html"))
    for line in text.splitlines():
        for part in _TAG.split(line) if html else [line]:
            doc = _parse_json(part)
            yield from (_json_groups(doc) if doc is not None else [integers(part)])


def _holds(group: list[int], counts: Counter) -> bool:
    have = Counter(group)
    return all(have[k] >= n for k, n in counts.items())


def findings(where: str, content: str | bytes, needles: Needles) -> list[str]:
    """What of ``needles`` ``content`` holds, one 'where: what' line each (never the value)."""
    raw = content if isinstance(content, bytes) else content.encode()
    out = []
    if any(h.encode() in raw.lower() for h in needles.hashes):
        out.append(f"{where}: a private input's plain SHA-256")
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return out  # binary: only the hash is meaningful
    if needles.totals & set(integers(text)):
        out.append(f"{where}: an exact total of the private input")
    counts = Counter(needles.puma_counts)
    if counts and any(_holds(g, counts) for g in number_groups(text)):
        out.append(f"{where}: the exact per-PUMA household counts of the private input")
    return out


def _read_only(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def release_runs(con: sqlite3.Connection, config_path: str) -> tuple[set[str], set[str]]:
    """(the ids of the ``dprelease-release`` flow runs of ``config_path``, their subflow runs and
    all their task runs; every flow-run and task-run id in Prefect's database)."""
    flows = {r[0] for r in con.execute("SELECT id, parameters FROM flow_run") if json.loads(r[1] or "{}").get("config_path") == config_path}
    task_parent = dict(con.execute("SELECT id, flow_run_id FROM task_run").fetchall())
    flow_parent = dict(con.execute("SELECT id, parent_task_run_id FROM flow_run").fetchall())
    while True:
        tasks = {t for t, f in task_parent.items() if f in flows}
        grown = flows | {f for f, t in flow_parent.items() if t in tasks}
        if grown == flows:
            return flows | tasks, set(task_parent) | set(flow_parent)
        flows = grown


def scan_database(db: Path, needles: Needles, config_path: str | None = None) -> list[str]:
    """Every text and blob value of every table of a SQLite database (opened read-only).

    With ``config_path`` (Prefect's database shared by the test session's runs), rows that name a
    flow or task run of another release run are left out: another test's release of the same
    input publishes noisy counts that may equal this input's exact ones by chance. Rows that name
    no run (flows, blocks, variables, ...) are scanned."""
    out = []
    with contextlib.closing(_read_only(db)) as con:
        own, runs = release_runs(con, config_path) if config_path is not None else (set(), set())
        tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            rows = con.execute(f'SELECT * FROM "{table}"')
            columns = [d[0] for d in rows.description]
            for row in rows:
                texts = [(c, v) for c, v in zip(columns, row) if isinstance(v, str | bytes)]
                named = {u for _, v in texts if isinstance(v, str) for u in _UUID.findall(v)} & runs
                if named and not named & own:
                    continue
                for column, value in texts:
                    out += findings(f"{db.name}: {table}.{column}", value, needles)
    return sorted(set(out))


def scan_files(files: Iterable[Path], needles: Needles) -> list[str]:
    return [f for p in files for f in findings(str(p), p.read_bytes(), needles)]


def stored_result(path: Path) -> bytes | None:
    """The pickle in a file of Prefect's result storage (a failed run's exception, a persisted
    result: base64, alone or as a JSON record's ``result``), or None."""
    raw = path.read_bytes()
    doc = _parse_json(raw.decode(errors="replace"))
    payload = doc.get("result") if isinstance(doc, dict) else raw
    if not isinstance(payload, str | bytes):
        return None
    try:  # base64 in lines (``base64.encodebytes``)
        blob = base64.b64decode(b"".join((payload.encode() if isinstance(payload, str) else payload).split()), validate=True)
    except ValueError:
        return None
    return blob if blob.startswith(b"\x80") else None  # a pickle starts with its protocol opcode


def scan_prefect_home(home: Path, needles: Needles) -> tuple[list[str], int]:
    """Every file of Prefect's home (the database's own pages, server logs, result storage); a
    stored result is read as what it holds (its object's repr), not as base64. Returns the
    findings and the number of stored results read."""
    files = sorted(p for p in home.rglob("*") if p.is_file())
    out = scan_files(files, needles)
    results = [(p, blob) for p in files if (blob := stored_result(p)) is not None]
    for p, blob in results:
        out += findings(f"{p} (stored result)", repr(pickle.loads(blob)), needles)
    return out, len(results)


def non_confidential_work_files(work_dir: Path) -> list[Path]:
    """The work directory's files outside :data:`CONFIDENTIAL_WORK_FILES`."""
    return [p for p in sorted(work_dir.rglob("*"))
            if p.is_file() and p.relative_to(work_dir).parts[0] not in CONFIDENTIAL_WORK_FILES]


def prefect_server_home() -> Path:
    """The Prefect home of the server this process talks to: the test session's shared server's
    (tests/conftest.py), else this process's own (its temporary server's)."""
    from tests.conftest import _SHARED_SERVER_ENV, SHARED_SERVER_HOME_ENV

    shared = os.environ.get(_SHARED_SERVER_ENV)
    if shared and os.environ.get("PREFECT_API_URL") == shared:
        return Path(os.environ[SHARED_SERVER_HOME_ENV])
    return Path(os.environ["PREFECT_HOME"])


def prefect_database() -> Path | None:
    """The SQLite file of the Prefect server this process talks to: the connection URL in the
    environment (the server inherits it), else Prefect's default database in the server's home;
    None for a database that is not a local SQLite file."""
    url = os.environ.get("PREFECT_SERVER_DATABASE_CONNECTION_URL") or os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL")
    if not url:
        return prefect_server_home() / "prefect.db"
    prefix = "sqlite+aiosqlite:///"
    return Path(url.removeprefix(prefix)) if url.startswith(prefix) and ":memory:" not in url else None


def settle_prefect(db: Path, config_path: str, timeout: float = 60.0) -> None:
    """Wait until Prefect has stored what the finished release runs of ``config_path`` sent: this
    process's queued logs and events are sent, then the server's event persister (it writes in
    batches, seconds apart) has stored the final-state event of each of their flow runs — a flow
    run's last event."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=timeout, at_exit=False)
    EventsWorker.drain_all(timeout=timeout, at_exit=False)
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.closing(_read_only(db)) as con:
            own, _ = release_runs(con, config_path)
            final = {(f"prefect.flow-run.{name}", f"prefect.flow-run.{i}") for i, name, kind in con.execute("SELECT id, state_name, state_type FROM flow_run")
                     if i in own and kind in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")}
            stored = set(con.execute("SELECT event, resource_id FROM events WHERE event LIKE 'prefect.flow-run.%'"))
        assert final, f"no finished flow run of {config_path} in Prefect's database"
        if final <= stored:
            return
        assert time.monotonic() < deadline, f"Prefect stored {len(final & stored)} of {len(final)} final-state events in {timeout:.0f}s"
        time.sleep(0.5)
