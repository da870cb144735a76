"""Ingestion tasks: validate and encode each input file into the run directory."""

from __future__ import annotations

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
    """Validate, encode and persist one input file; returns its (path, report) record.

    Raises InputError (file, line, column, what was expected) on bad input.
    """
    spec = (cfg.private if role == "private" else cfg.public)[index]
    out = paths.inputs_dir / f"{role}-{index:02d}.npz"
    data, report = load_input(cfg, spec)
    save_npz_atomic(out, data.to_npz)
    report = {"role": role, "path": str(cfg.input_path(spec)), **report, "encoded": str(out)}
    return report


def validation_record(reports: list[dict], issues: list[InputError]) -> dict:
    """The ingestion gate's JSON result kept with the run (work dir only)."""
    return {
        "success": not issues,
        "inputs": [{k: r[k] for k in ("role", "path", "file", "sha256", "layout")} for r in reports],
        "issues": [i.to_dict() for e in issues for i in e.issues],
    }


def write_validation(paths: RunPaths, record: dict) -> Path:
    write_json_atomic(paths.validation_path, record)
    return paths.validation_path
