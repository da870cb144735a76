"""Publishing: write the release into a temporary directory, hash it, rename it into place."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from engine.data import HierarchicalData
from schemas.data_dictionary import UNWEIGHTED
from schemas.data_dictionary import with_weights as with_weights_dictionary
from schemas.input_independence import sha256_file
from schemas.release_config import ReleaseConfig
from schemas.release_contract import validate_release_tables
from schemas.release_expectations import ReleaseGateRun
from schemas.release_schema import COUNT_OF_COUNTS_SCHEMA, INTERVALS_SCHEMA, MEASUREMENTS_SCHEMA, PARTITION_SCHEMA, to_tables
from schemas.weight_totals import WeightTotals
from tasks.audit import AuditLog
from tasks.intervals import TABLE as INTERVALS
from tasks.intervals import manifest_entry as intervals_entry
from tasks.measurements_table import TABLE as MEASUREMENTS
from tasks.measurements_table import manifest_entry as measurements_entry
from tasks.release_parts import ReleaseParts
from tasks.release_report import REPORT, combined_tables, render_report, report_tables
from tasks.weights import calibrate, weight_keys, with_weights

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LIBRARIES = ("numpy", "scipy", "pandas", "pyarrow", "pydantic", "opendp", "great-expectations", "prefect", "prefect-dask", "dask", "distributed", "torch")
# the release gate: gate(with count-of-counts?) -> a ReleaseGateRun that checks the release's parts
# and finishes with the JSON result to ship (schemas.release_expectations); raises to refuse publishing
ReleaseGate = Callable[[bool], ReleaseGateRun]
GATE_RESULT = "validation/gx_release.json"


def hash_tree(root: Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file below root, keyed by relative POSIX path (sorted)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in exclude:
            out[rel] = sha256_file(p)
    return out


HMAC_KEY_ENV = "DPRELEASE_INPUT_KEY_FILE"


def input_key(run_dir: Path) -> bytes:
    """The secret key of the inputs' keyed hashes: the file named by ``$DPRELEASE_INPUT_KEY_FILE``
    (an agency key kept outside every release, so the same file hashes alike across releases),
    else one drawn per run and kept in the owner-only work directory (``input_hmac.key``)."""
    env = os.environ.get(HMAC_KEY_ENV)
    if env:
        key = Path(env).expanduser().read_bytes().strip()
        if len(key) < 16:
            raise ValueError(f"{env}: the input key must hold at least 16 bytes")
        return key
    p = run_dir / "input_hmac.key"
    if not p.exists():
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_hex(32).encode())
    return p.read_bytes().strip()


def keyed_file_hash(path: Path, key: bytes) -> str:
    """HMAC-SHA256 of a file's bytes: who holds the key can check that a given file was the
    input; who does not cannot test a guess of the confidential file against it."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_identity(role: str, path: Path, run_dir: Path) -> dict:
    """How the manifest names a file a run read: a public file by SHA-256; a confidential
    (private) one by HMAC-SHA256 under the secret input key (a bare hash would let anyone test a guess)."""
    if role == "public":
        return {"sha256": sha256_file(path)}
    key = input_key(run_dir)
    return {"hmac_sha256": keyed_file_hash(path, key), "hmac_key_id": hashlib.sha256(b"dprelease-input-key-id:" + key).hexdigest()[:16]}


def input_identity(record: dict, run_dir: Path, housing: Path | None = None) -> dict:
    """The manifest's entry of one ingested input: its person file and, in the legacy layout, the
    housing file read beside it (vacant units, group quarters), each named by :func:`file_identity`."""
    out = {k: record.get(k) for k in ("role", "file", "layout", "survey_years")} | file_identity(record["role"], Path(record["path"]), run_dir)
    if housing is not None:
        out["housing"] = {"file": housing.name, **file_identity(record["role"], housing, run_dir)}
    return out


def manifest_inputs(cfg: ReleaseConfig, records: list[dict], run_dir: Path) -> list[dict]:
    """The manifest's ``inputs``: every file the run read (:func:`input_identity` of each ingested
    input; ``records``: their ingest reports, ``tasks.ingest.read_report``, kept in the work directory)."""
    housing = {(role, str(cfg.input_path(spec))): cfg.housing_path(spec)
               for role, specs in (("private", cfg.private), ("public", cfg.public)) for spec in specs}
    return [input_identity(r, run_dir, housing[(r["role"], r["path"])]) for r in records]


def code_version() -> dict:
    info: dict[str, str | bool | None] = {"package": "dprelease", "version": _version("dprelease")}
    try:
        commit = subprocess.run(["git", "-C", str(PROJECT_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "-C", str(PROJECT_ROOT), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10)
        if commit.returncode == 0:
            info["git_commit"] = commit.stdout.strip()
            info["git_dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    pyproject = PROJECT_ROOT / "pyproject.toml"
    if pyproject.exists():
        info["pyproject_sha256"] = sha256_file(pyproject)
    return info


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def library_versions() -> dict:
    return {"python": sys.version.split()[0], **{n: _version(n) for n in LIBRARIES}}


# rows per Parquet row group, at least and at most: a PUMA's file is one row group (up to a
# million rows), whatever batches the writer is fed, so its bytes depend on its rows only
ROW_GROUP = 1 << 20


def _write_dataset(table: pa.Table, base: Path) -> None:
    """Append one part (whole states) to the hive-partitioned dataset at ``base``: every PUMA's
    rows, in table order, go to ``ST=../PUMA=../part-0.parquet`` as one row group, the same file
    whether the PUMA comes in a state's table or the whole release's."""
    pads.write_dataset(
        table,
        base,
        format="parquet",
        partitioning=pads.partitioning(PARTITION_SCHEMA, flavor="hive"),
        existing_data_behavior="overwrite_or_ignore",
        basename_template="part-{i}.parquet",
        preserve_order=True,
        min_rows_per_group=ROW_GROUP,
        max_rows_per_group=ROW_GROUP,
    )


def write_release(
    release_dir: Path,
    data: HierarchicalData | ReleaseParts,
    manifest: dict,
    count_of_counts: pa.Table | None = None,
    measurements: pa.Table | Callable[[], pa.Table] | None = None,
    intervals: pa.Table | Callable[[], pa.Table] | None = None,
    extra_files: dict[str, bytes] | None = None,
    audit: AuditLog | None = None,
    gate: ReleaseGate | None = None,
    dictionary: dict | None = None,
    weight_totals: WeightTotals | None = None,
) -> dict:
    """Write the complete release to a temporary sibling directory, then rename it into place.

    Returns the manifest as written. Nothing half-written is left at ``release_dir``: on any
    failure the temporary directory is removed. The microdata (``data``, or its :class:`ReleaseParts`)
    are read one part (whole states) at a time, twice: first every part is converted and checked
    (the release contract, the gate, the counts the report draws and the weights read), then,
    everything having passed, converted again and written; so the memory of publishing does not
    grow with the number of states. With ``gate`` (the Great Expectations release gate,
    ``schemas.release_expectations.ReleaseGateRun``), a failing part or count-of-counts table
    raises before anything is written, and the gate's JSON result ships as
    ``validation/gx_release.json`` (hashed in the manifest like every output); the first pass also
    counts the released households and persons (the manifest's ``release_counts``). ``measurements``
    (every noisy measurement of the run, ``tasks.measurements_table``) ships as
    ``measurements.parquet``, ``intervals`` (the error estimates beside the released answers,
    ``tasks.intervals``) as ``intervals.parquet``, each described in the manifest (its ``measurements`` and
    ``intervals`` entries); either may be given as a callable that returns it, called once the
    microdata have passed their checks (a table computed elsewhere meanwhile). The release report (``report.html``,
    ``tasks.release_report``) is rendered from the microdata's counts, these tables, the domain, the
    gate's result and the manifest's public fields, before the hashes. With ``audit``, the publish
    event (carrying the manifest's SHA-256) is appended and the chained log is shipped as ``audit.jsonl``. The caller
    holds the run lock, so leftovers of an earlier, killed publish of this release are removed.
    ``dictionary`` (``schemas.data_dictionary``) ships in ``domain.json`` beside the domain. With
    ``weight_totals`` the households and persons carry ``WEIGHT``, calibrated to those public totals
    (``tasks.weights``; the file is recorded as a public input); without, the manifest and the
    dictionary state that the microdata are an unweighted sample.
    """
    if release_dir.exists():
        raise FileExistsError(f"release {release_dir} exists already; a finished release is never overwritten")
    parts = data if isinstance(data, ReleaseParts) else ReleaseParts.of(data)
    domain = parts.domain
    release_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in release_dir.parent.glob(f".{release_dir.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = release_dir.parent / f".{release_dir.name}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        coc = None if count_of_counts is None else count_of_counts.cast(COUNT_OF_COUNTS_SCHEMA)
        manifest = dict(manifest)
        checking = None if gate is None else gate(coc is not None)
        counts, keys, n_households, n_persons = [], [], 0, 0
        for part in parts:
            households, persons = to_tables(part)
            n_households, n_persons = n_households + households.num_rows, n_persons + persons.num_rows
            if checking is not None:
                checking.check(households, persons)
            validate_release_tables(households, persons, domain)
            counts.append(report_tables(domain.to_dict(), manifest.get("workload") or {}, households, persons))
            if weight_totals is not None:
                keys.append(weight_keys(households, domain.size_attribute))
        manifest["release_counts"] = {"households": n_households, "persons": n_persons}  # synthetic counts: public
        gate_result = None if checking is None else checking.finish(coc)
        meas, ivs = (None if t is None else (t() if callable(t) else t).cast(schema)
                     for t, schema in ((measurements, MEASUREMENTS_SCHEMA), (intervals, INTERVALS_SCHEMA)))
        if meas is not None:
            manifest["measurements"] = measurements_entry(meas)
        if ivs is not None:
            manifest["intervals"] = intervals_entry(ivs)
        weights = None
        if weight_totals is None:
            manifest["weights"] = {"weighted": False, "statement": UNWEIGHTED}
        else:
            st, puma, size = (np.concatenate(k) for k in zip(*keys))
            weights, entry = calibrate(st, puma, size, weight_totals)
            totals = {"role": "public", "use": "weight totals", "file": weight_totals.path.name, "path": str(weight_totals.path),
                      "sha256": sha256_file(weight_totals.path)}
            manifest["inputs"] = [*manifest.get("inputs", []), totals]
            manifest["weights"] = {**entry, "totals": totals}
            dictionary = None if dictionary is None else with_weights_dictionary(dictionary)
        domain_json = domain.to_dict() | ({} if dictionary is None else {"dictionary": dictionary})
        offset = 0
        for part in parts:
            households, persons = to_tables(part)
            if weights is not None:
                households, persons = with_weights(households, persons, weights[offset:offset + households.num_rows])
            offset += households.num_rows
            _write_dataset(households, tmp / "households")
            _write_dataset(persons, tmp / "persons")
        (tmp / "domain.json").write_text(json.dumps(domain_json, indent=2))
        if coc is not None:
            pq.write_table(coc, tmp / "count_of_counts.parquet")
        if meas is not None:
            pq.write_table(meas, tmp / MEASUREMENTS, compression="zstd")
        if ivs is not None:
            pq.write_table(ivs, tmp / INTERVALS, compression="zstd")
        if gate_result is not None:
            (tmp / GATE_RESULT).parent.mkdir(parents=True, exist_ok=True)
            (tmp / GATE_RESULT).write_bytes(gate_result)
        for name, blob in (extra_files or {}).items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp / name).write_bytes(blob)
        (tmp / REPORT).write_text(render_report(manifest, domain_json, combined_tables(counts), ivs,
                                                None if gate_result is None else json.loads(gate_result)), encoding="utf-8")
        manifest["published_at"] = datetime.now(UTC).isoformat()
        manifest["outputs"] = hash_tree(tmp)
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        if audit is not None:
            audit.append("publish", release=release_dir.name, manifest_sha256=sha256_file(tmp / "manifest.json"), n_outputs=len(manifest["outputs"]))
            shutil.copyfile(audit.path, tmp / "audit.jsonl")
        os.rename(tmp, release_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def read_release(release_dir: Path) -> tuple[pa.Table, pa.Table]:
    """Read back (households, persons) with the partition keys typed as strings."""
    part = pads.partitioning(PARTITION_SCHEMA, flavor="hive")
    hh = pads.dataset(release_dir / "households", format="parquet", partitioning=part).to_table()
    pp = pads.dataset(release_dir / "persons", format="parquet", partitioning=part).to_table()
    return hh, pp
