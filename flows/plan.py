"""`dprelease plan`: the budget allocation of a config, without reading any data."""

from __future__ import annotations

from schemas.release_config import ReleaseConfig
from tasks.privacy import budget_plan


def render_plan(cfg: ReleaseConfig) -> str:
    plan = budget_plan(cfg)
    b = cfg.budget
    target = f"rho = {b.rho}" if b.rho is not None else f"(epsilon, delta) = ({b.epsilon}, {b.delta:g}) converted to rho by {b.conversion}"
    head = [
        f"release {cfg.name}: privacy unit {cfg.privacy_unit}, synthesizer {cfg.synthesizer}",
        f"budget: {target}",
        "",
    ]
    return "\n".join(head) + plan.render_table()
