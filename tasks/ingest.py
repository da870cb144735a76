"""Ingestion tasks: validate and encode each input file into the run directory."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from prefect import task

from engine.data import Geography, HierarchicalData
from schemas.domain_spec import load_domain_spec
from schemas.geography import check_declared, declared
from schemas.ingestion import HouseholdRules, encode_person_table
from schemas.pums_reader import InputError, read_person_file
from schemas.release_config import InputSpec, ReleaseConfig
from tasks.run_context import RunPaths, save_npz_atomic, write_json_atomic


def household_rules(cfg: ReleaseConfig) -> HouseholdRules:
    """The config's household rules; under the person unit a housing unit without exactly one
    householder is excluded rather than refused, so that every neighbour (a householder removed,
    a second one added) still gives a release (``docs/privacy.md``)."""
    r = cfg.household_rules
    return HouseholdRules(r.max_household_size, r.group_quarters, r.oversize,
                          householders="exclude" if cfg.privacy_unit == "person" else "refuse")


def load_input(cfg: ReleaseConfig, spec: InputSpec, role: str) -> tuple[HierarchicalData, dict]:
    """Validate + encode one input (no Prefect); attribute subset of the config applied. A private
    input's records must lie in the declared geography (``schemas.geography.check_declared``); a
    public input's geography is not the release's (other states, other years)."""
    domain_spec, rules = load_domain_spec(cfg.domain_path()), household_rules(cfg)
    table = read_person_file(cfg.input_path(spec), domain_spec, layout=spec.layout, housing=cfg.housing_path(spec),
                             householders=rules.householders)
    if role == "private":
        check_declared(table, domain_spec, declared(cfg.puma_list(), cfg.geography.states))
    data, report = encode_person_table(table, domain_spec, rules)
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
    data, report = load_input(cfg, spec, role)
    save_npz_atomic(out, data.to_npz)
    report_path = out.with_suffix(".json")
    write_json_atomic(report_path, {"role": role, "path": str(cfg.input_path(spec)), **report})
    return {"role": role, "path": str(cfg.input_path(spec)), "encoded": str(out), "report": str(report_path)}


def release_geography(cfg: ReleaseConfig, private_npz: str) -> Geography:
    """The release's nodes: ``geography.states`` (absent: the states of the private files, which
    the release declares public: which states it covers is its design) with each one's PUMAs from
    the public PUMA list. No PUMA is taken from the private records."""
    states = cfg.geography.states
    if states is None:
        states = np.unique(HierarchicalData.from_npz(private_npz).geo[:, 0]).tolist()
    return declared(cfg.puma_list(), states)


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
