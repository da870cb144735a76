"""The run's two Great Expectations gates (``schemas/release_expectations.py``,
``schemas/input_expectations.py``) wired to the run directories.

- :func:`input_gate` — after ingestion: the value-free input suite over the encoded inputs per
  role; result ``work/<name>/gx_inputs.json`` (owner-only, never published).
- :func:`release_gate` — the gate ``write_release`` runs on the synthetic tables before writing
  anything: geography from the run's counts result (the nodes of the declared geography),
  Data Docs into ``work/<name>/qa/gx_data_docs/``; its result ships as
  ``validation/gx_release.json``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from engine.data import HierarchicalData
from schemas.domain_spec import load_domain_spec
from schemas.release_config import ReleaseConfig
from tasks.run_context import RunPaths

INPUT_RESULT = "gx_inputs.json"
DATA_DOCS = "gx_data_docs"


def data_docs_dir(qa_dir: Path) -> Path:
    return Path(qa_dir) / DATA_DOCS


def input_gate(cfg: ReleaseConfig, paths: RunPaths, reports: list[dict]) -> Path:
    """Run the value-free input suite on every role's encoded inputs (merged); raises
    ``InputGateError`` (table and expectation only) when it fails."""
    from schemas.input_expectations import run_input_gate

    inputs = {}
    for role in ("private", "public"):
        parts = [HierarchicalData.from_npz(r["encoded"]) for r in reports if r["role"] == role]
        if parts:
            inputs[role] = HierarchicalData.concat(parts)
    out = paths.run_dir / INPUT_RESULT
    run_input_gate(inputs, load_domain_spec(cfg.domain_path()), out)
    return out


def release_gate(cfg: ReleaseConfig, paths: RunPaths, counts_path: str, domain):
    """The release gate for ``write_release(gate=...)``: a fresh ``ReleaseGateRun`` per publish attempt."""
    from schemas.release_expectations import ReleaseGateRun, ReleaseGeography, householder_of
    from tasks.count_of_counts import node_households

    geography = ReleaseGeography.from_node_keys(node_households(counts_path))
    householder = householder_of(load_domain_spec(cfg.domain_path()), domain)
    docs = data_docs_dir(paths.qa_dir)

    def gate(count_of_counts: bool) -> ReleaseGateRun:
        shutil.rmtree(docs, ignore_errors=True)  # the Data Docs of this attempt only
        return ReleaseGateRun(domain, geography, householder, count_of_counts, docs_dir=docs)

    return gate
