"""The hash-chained audit log of a release (``audit.jsonl``) and its verification.

Every line is one JSON event with ``seq``, ``time``, ``event``, its fields, ``prev`` (the hash of
the previous line's record, 64 zeros for the first) and ``hash`` = SHA-256 of the canonical JSON
(sorted keys, no spaces) of the record without ``hash``. Changing, inserting, removing or
reordering any line breaks the chain. The last event of a published release is ``publish``, which
carries the SHA-256 of ``manifest.json``; the manifest carries the SHA-256 of every other output.
Events carry no confidential value (geography node ids, ρ, mechanism names, counts of files).
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path

from engine.privacy import exclusive_lock
from schemas.input_independence import sha256_file

GENESIS = "0" * 64
UNHASHED_RELEASE_FILES = ("manifest.json", "audit.jsonl")


def _canonical(record: dict) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), default=str).encode()


def record_hash(record: dict) -> str:
    return hashlib.sha256(_canonical({k: v for k, v in record.items() if k != "hash"})).hexdigest()


class AuditLog:
    """Append-only, hash-chained JSON-lines log; safe for several processes (flock)."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _last(self) -> tuple[int, str]:
        """(seq, hash) of the last record, read from the end of the file: an append must not
        cost the length of the log (a national run appends tens of thousands of charges)."""
        if not self.path.exists():
            return -1, GENESIS
        with open(self.path, "rb") as f:
            end = f.seek(0, os.SEEK_END)
            chunk = 1 << 16
            while True:
                start = max(end - chunk, 0)
                f.seek(start)
                lines = [line for line in f.read(end - start).splitlines() if line.strip()]
                # the first line of a chunk may be cut: trust it only when the chunk starts the file
                if len(lines) > 1 or (lines and start == 0):
                    rec = json.loads(lines[-1])
                    return int(rec["seq"]), rec["hash"]
                if start == 0:
                    return -1, GENESIS
                chunk *= 4

    def append(self, event: str, **fields) -> dict:
        return self.append_many([(event, fields)])[0]

    def append_many(self, events: list[tuple[str, dict]]) -> list[dict]:
        """Append several events, chained in order, under one lock and with one write and fsync."""
        with exclusive_lock(self.path.with_name(self.path.name + ".lock")):
            seq, prev = self._last()
            records, lines = [], []
            for event, fields in events:
                seq += 1
                record = {"seq": seq, "time": datetime.now(UTC).isoformat(), "event": event, **fields, "prev": prev}
                record["hash"] = prev = record_hash(record)
                records.append(record)
                lines.append(_canonical(record) + b"\n")
            if lines:
                with open(self.path, "ab") as f:
                    f.write(b"".join(lines))
                    f.flush()
                    os.fsync(f.fileno())
            return records

    def events(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_bytes().splitlines() if line.strip()]


def verify_chain(path: Path) -> list[str]:
    """Problems found in the chain of ``path`` (empty when intact)."""
    problems = []
    prev = GENESIS
    try:
        lines = Path(path).read_bytes().splitlines()
    except OSError as e:
        return [f"{path}: cannot read the audit log ({e.strerror})"]
    if not lines:
        return [f"{path}: the audit log is empty"]
    for i, line in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            problems.append(f"{path.name} line {i}: not valid JSON (the log was altered)")
            return problems
        if rec.get("seq") != i - 1:
            problems.append(f"{path.name} line {i}: sequence number {rec.get('seq')} where {i - 1} was expected")
        if rec.get("prev") != prev:
            problems.append(f"{path.name} line {i}: its 'prev' does not match the hash of line {i - 1} (chain broken)")
        if record_hash(rec) != rec.get("hash"):
            problems.append(f"{path.name} line {i}: its content does not match its hash (the event was altered)")
        prev = rec.get("hash")
    return problems


def verify_release(release_dir: Path) -> list[str]:
    """Recompute every hash of a published release: the audit chain, the manifest's hash in the
    final publish event, and every output file listed in the manifest (no file missing, changed or
    added)."""
    release_dir = Path(release_dir)
    manifest_path = release_dir / "manifest.json"
    audit_path = release_dir / "audit.jsonl"
    problems = []
    for p in (manifest_path, audit_path):
        if not p.exists():
            problems.append(f"{p}: missing")
    if problems:
        return problems
    problems += verify_chain(audit_path)
    events = AuditLog(audit_path).events() if not problems else []
    if events:
        last = events[-1]
        if last.get("event") != "publish":
            problems.append(f"{audit_path.name}: the last event is {last.get('event')!r}, not 'publish'")
        elif last.get("manifest_sha256") != sha256_file(manifest_path):
            problems.append("manifest.json: its SHA-256 differs from the one recorded in the publish event (the manifest was altered)")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return problems + ["manifest.json: not valid JSON"]
    outputs: dict = manifest.get("outputs", {})
    for rel, digest in sorted(outputs.items()):
        p = release_dir / rel
        if not p.is_file():
            problems.append(f"{rel}: listed in the manifest but missing")
        elif sha256_file(p) != digest:
            problems.append(f"{rel}: SHA-256 differs from the manifest (the file was altered)")
    for p in sorted(release_dir.rglob("*")):
        rel = p.relative_to(release_dir).as_posix()
        if p.is_file() and rel not in outputs and rel not in UNHASHED_RELEASE_FILES:
            problems.append(f"{rel}: not listed in the manifest (a file was added)")
    return problems
