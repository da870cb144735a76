"""Ingestion tasks: validate and encode each input file into the run directory."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task

from engine.hierarchical_data import HierarchicalData
from schemas.domain_spec import load_domain_spec
from schemas.ingestion import HouseholdRules, load_person_file
from schemas.pums_reader import InputError
from schemas.release_config import InputSpec, ReleaseConfig
from tasks.run_context import RunPaths, save_npz_atomic, write_json_atomic


def household_rules(cfg: ReleaseConfig) -> HouseholdRules:
    r = cfg.household_rules
    return HouseholdRules(r.max_household_size, r.group_quarters, r.oversize)


def load_input(cfg: ReleaseConfig, spec: InputSpec) -> tuple[HierarchicalData, dict]:
    """Validate + encode one input (no Prefect); attribute subset of the config applied."""
    domain_spec = load_domain_spec(cfg.domain_path())
    data, report = load_person_file(
        cfg.input_path(spec), domain_spec, household_rules(cfg), layout=spec.layout, housing=cfg.housing_path(spec)
    )
    a = cfg.attributes
    if a.group is not None or a.person is not None:
        data = data.project(a.group, a.person)
    return data, report


@task(name="ingest-input", retries=0)
def ingest_input(cfg: ReleaseConfig, paths: RunPaths, role: str, index: int) -> dict:
    """Validate, encode and persist one input file.

    The exclusion report (exact counts and the plain SHA-256 of the file: confidential for private
    inputs, since a bare hash lets whoever knows every record but one test a guess) is written next
    to the encoded data in the owner-only work directory; the returned record holds only the role
    and paths, because task results and subflow parameters reach Prefect's database. Raises
    InputError (file, line, column, what was expected) on bad input.
    """
    spec = (cfg.private if role == "private" else cfg.public)[index]
    out = paths.inputs_dir / f"{role}-{index:02d}.npz"
    data, report = load_input(cfg, spec)
    save_npz_atomic(out, data.to_npz)
    report_path = out.with_suffix(".json")
    write_json_atomic(report_path, {"role": role, "path": str(cfg.input_path(spec)), **report})
    return {"role": role, "path": str(cfg.input_path(spec)), "encoded": str(out), "report": str(report_path)}


def read_report(record: dict) -> dict:
    """The full exclusion report of one ingested input, with its role, path, file name, SHA-256
    and layout (work directory only)."""
    return json.loads(Path(record["report"]).read_text())


def validation_record(records: list[dict], issues: list[InputError]) -> dict:
    """The ingestion gate's JSON result kept with the run (work dir only)."""
    return {
        "success": not issues,
        "inputs": [{k: report[k] for k in ("role", "path", "file", "sha256", "layout")} for report in map(read_report, records)],
        "issues": [i.to_dict() for e in issues for i in e.issues],
    }


def write_validation(paths: RunPaths, record: dict) -> Path:
    write_json_atomic(paths.validation_path, record)
    return paths.validation_path
