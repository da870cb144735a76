"""The hash-chained audit log and `dprelease audit verify`: any changed byte is found."""

import json

import numpy as np
import pytest

from flows.cli import main
from tasks.audit import AuditLog, verify_chain, verify_release
from tasks.publish import write_release


@pytest.fixture
def release(tmp_path, vermont):
    data, _ = vermont
    audit = AuditLog(tmp_path / "work" / "audit.jsonl")
    (tmp_path / "work").mkdir()
    audit.append("run_start", release="t")
    audit.append("charge", key="k1", stage="state_synthesis", level="state", node="50", rho="1/100")
    rel = tmp_path / "rel"
    write_release(rel, data.take(np.arange(200)), {"release": "t"}, audit=audit)
    return rel


def flip_byte(path, offset=None):
    b = bytearray(path.read_bytes())
    i = len(b) // 2 if offset is None else offset
    b[i] ^= 0x01
    path.write_bytes(bytes(b))


def test_intact_release_verifies(release, capsys):
    assert verify_release(release) == []
    assert main(["audit", "verify", str(release)]) == 0
    assert "OK" in capsys.readouterr().out
    events = AuditLog(release / "audit.jsonl").events()
    assert [e["event"] for e in events] == ["run_start", "charge", "publish"]


def test_flipped_byte_in_an_output_is_found(release, capsys):
    part = next((release / "households").rglob("*.parquet"))
    flip_byte(part)
    problems = verify_release(release)
    assert len(problems) == 1 and "SHA-256 differs" in problems[0] and part.name in problems[0]
    assert main(["audit", "verify", str(release)]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_flipped_byte_in_the_log_is_found(release):
    log = release / "audit.jsonl"
    text = log.read_text()
    i = text.index('"state_synthesis"') + 3  # inside the charge event
    flip_byte(log, i)
    problems = verify_release(release)
    assert any("line 2" in p and "altered" in p for p in problems)


def test_removed_event_breaks_the_chain(tmp_path):
    log = AuditLog(tmp_path / "a.jsonl")
    for i in range(4):
        log.append("e", i=i)
    lines = log.path.read_text().splitlines()
    log.path.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    problems = verify_chain(log.path)
    assert any("chain broken" in p for p in problems)


def test_edited_manifest_and_added_file_are_found(release):
    m = json.loads((release / "manifest.json").read_text())
    m["release"] = "forged"
    (release / "manifest.json").write_text(json.dumps(m))
    (release / "extra.txt").write_text("x")
    problems = verify_release(release)
    assert any("manifest was altered" in p for p in problems)
    assert any("extra.txt" in p and "added" in p for p in problems)


def test_batched_appends_chain_like_single_ones(tmp_path):
    """``append_many`` chains its events in order under one lock; the last record is found from
    the end of the file whatever the records' lengths (long ones cross the 64 KiB read window)."""
    log = AuditLog(tmp_path / "audit.jsonl")
    assert log.append_many([]) == []
    log.append("run_start", release="t")
    added = log.append_many([("charge", {"key": f"k{i}", "pad": "x" * (i * 9000)}) for i in range(12)])
    assert [r["seq"] for r in added] == list(range(1, 13))
    log.append("stage_end", stage="s")
    events = log.events()
    assert [e["seq"] for e in events] == list(range(14)) and verify_chain(log.path) == []
    assert events[-1]["prev"] == added[-1]["hash"]
