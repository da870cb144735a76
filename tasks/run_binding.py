"""A run's work directory is bound to the config and the inputs it started with.

Everything a resumed run reuses (encoded inputs, the ledger, stored measurements, finished nodes)
was derived from those; resumed under another config or another input, the run would publish
microdata of one input under the manifest of another, or charge a ledger planned for another
budget. The binding record (``binding.json`` in the owner-only work directory) holds:

- the canonical config: the parsed and validated config with its defaults filled in and its paths
  resolved (``ReleaseConfig.model_dump``), not the file's bytes, so that comments, key order and
  formatting do not matter while every value the run uses does (a default changed by an upgrade
  included);
- each input file's identity: resolved path, SHA-256 and size (person and housing files; the work
  directory is owner-only, like the confidential inputs themselves);
- the budget plan (the exact ρ per stage and level the ledger is opened with).

It is written once the inputs have passed ingestion: before that the directory holds nothing
derived from them that a rerun would reuse (ingestion rewrites every encoded input), so a run
refused for a bad input can be rerun with the input fixed. A resumed run is compared with it
before anything is read or written, and refused with one line naming what changed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.input_independence import InputFile
from schemas.release_config import ReleaseConfig
from tasks.context import budget_plan
from tasks.run_context import RunRefused, write_json_atomic

BINDING = "binding.json"


def _canonical(obj: Any) -> Any:
    """``obj`` as it reads back from the binding file (JSON types, sorted keys)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def run_binding(cfg: ReleaseConfig, inputs: list[InputFile]) -> dict:
    """The binding record of a run of ``cfg`` (as loaded, before the run refines its allocation) on ``inputs``."""
    return _canonical({
        "config": cfg.model_dump(mode="json"),
        "inputs": {f.key: {"path": str(f.path), "sha256": f.sha256, "size": f.size} for f in inputs},
        "budget_plan": budget_plan(cfg).to_dict(),
    })


def _flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys (``budget.epsilon``, ``private.0.path``) of every leaf of a JSON value."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else None
    if items is None:
        return {prefix: obj}
    out: dict[str, Any] = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out or {prefix: obj}


def binding_changes(bound: dict, now: dict) -> list[str]:
    """What differs between a run's binding record and the one of the run now asked for: config
    keys, inputs (another file, or the same path with other content) and the budget plan. No hash
    or value is named (the config's values are the operator's own; the inputs' are not printed)."""
    old_cfg, new_cfg = _flat(bound.get("config", {})), _flat(now["config"])
    absent = object()
    changes = [f"config {k}" for k in sorted(set(old_cfg) | set(new_cfg)) if old_cfg.get(k, absent) != new_cfg.get(k, absent)]
    old_in, new_in = bound.get("inputs", {}), now["inputs"]
    for key in sorted(set(old_in) | set(new_in)):
        a, b = old_in.get(key), new_in.get(key)
        if a is None or b is None:
            changes.append(f"input {key} {'added' if a is None else 'removed'}")
        elif a.get("path") != b["path"]:
            changes.append(f"input {key} (another file)")
        elif (a.get("sha256"), a.get("size")) != (b["sha256"], b["size"]):
            changes.append(f"input {key} (its content)")
    if bound.get("budget_plan") != now["budget_plan"]:
        changes.append("the budget plan")
    return changes


def check_binding(run_dir: Path, binding: dict) -> None:
    """Refuse to resume the run in ``run_dir`` when its binding record differs from ``binding``
    (nothing to compare: a new run, or one that stopped before its inputs passed ingestion)."""
    path = run_dir / BINDING
    if not path.exists():
        return
    try:
        bound = json.loads(path.read_text())
    except (OSError, ValueError):
        raise RunRefused(f"{path}: the run's binding record cannot be read; refusing to resume a run whose config and inputs "
                         "cannot be compared (start afresh under another --name)") from None
    changes = binding_changes(bound, binding) if isinstance(bound, dict) else ["the binding record"]
    if changes:
        raise RunRefused(f"{run_dir} holds a run started with another config or other inputs ({'; '.join(changes)}); "
                         "a run resumes only with the config and inputs it started with: restore them, or start afresh under another --name")


def write_binding(run_dir: Path, binding: dict) -> None:
    """Bind the work directory (once: a resumed run was compared with the record by :func:`check_binding`)."""
    path = run_dir / BINDING
    if not path.exists():
        write_json_atomic(path, binding)
