"""Run bookkeeping shared by the stages: audit events for ledger charges, Prefect artifacts."""

from __future__ import annotations

import re

from engine.privacy import PrivacyLedger
from tasks.audit import AuditLog


def sync_charges(audit: AuditLog, ledger: PrivacyLedger) -> int:
    """Append one ``charge`` audit event for every ledger charge not yet in the log (idempotent
    across resumed runs). Returns the number of events added."""
    ledger.reload()
    seen = {e.get("key") for e in audit.events() if e.get("event") == "charge"}
    new = []
    for c in sorted(ledger.charges(), key=lambda c: (c.timestamp, c.key)):
        if c.key in seen:
            continue
        rec = c.to_json()
        rec.pop("type", None)
        rec.pop("timestamp", None)
        new.append(("charge", rec))
    return len(audit.append_many(new))


def artifact_key(name: str, suffix: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes."""
    return re.sub(r"[^a-z0-9-]+", "-", f"{name}-{suffix}".lower()).strip("-")


def ledger_rows(summary: dict) -> list[dict]:
    rows = []
    for stage, s in summary["stages"].items():
        for level, lv in s["levels"].items():
            rows.append(
                {
                    "stage": stage,
                    "level": level,
                    "rho allocated per node": f"{lv['allocated_per_node_float']:.6g}",
                    "rho spent (max over nodes)": f"{lv['spent_max_node_float']:.6g}",
                    "nodes": lv["n_nodes"],
                    "charges": lv["n_charges"],
                }
            )
    t = summary["total"]
    rows.append(
        {
            "stage": "TOTAL",
            "level": "",
            "rho allocated per node": f"{t['allocated_float']:.6g}",
            "rho spent (max over nodes)": f"{t['spent_float']:.6g}",
            "nodes": "",
            "charges": summary["n_charges"],
        }
    )
    return rows


def publish_artifacts(name: str, summary: dict, markdown: str) -> None:
    """A table artifact with the budget ledger and a markdown release summary. Both hold only
    public facts: ρ per stage/level, node counts, file names — never a confidential value."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    create_table_artifact(key=artifact_key(name, "ledger"), table=ledger_rows(summary), description=f"Privacy ledger of release {name}")
    create_markdown_artifact(key=artifact_key(name, "summary"), markdown=markdown, description=f"Release summary of {name}")


def release_markdown(manifest: dict) -> str:
    t = manifest["privacy"]["ledger"]["total"]
    lines = [
        f"# Release `{manifest['release']}`",
        "",
        f"- synthesizer: **{manifest['synthesizer']['name']}** — {manifest['synthesizer']['description']}",
        f"- privacy unit: {manifest['privacy_unit']}",
        f"- ρ spent: {t['spent_float']:.6g} of {t['allocated_float']:.6g} (zCDP)",
        f"- (ε, δ) spent: ({t['epsilon_spent_cks']:.4g}, {t['delta']:g}) by Canonne–Kamath–Steinke; ({t['epsilon_spent_simple']:.4g}, {t['delta']:g}) by ρ + 2√(ρ log 1/δ)",
        f"- stages: {', '.join(manifest['stages'])}",
        f"- synthetic households: {manifest['release_counts']['households']}, persons: {manifest['release_counts']['persons']}",
        f"- code: {manifest['code'].get('git_commit', 'unknown')}",
        *([f"- noisy measurements published: {m['measurements']} ({m['rows']} cells) in `{m['table']}`"] if (m := manifest.get("measurements")) else []),
        "",
        "Noise: OpenDP samplers (contrib), OS entropy, no seeds.",
    ]
    return "\n".join(lines)
