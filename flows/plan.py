"""`dprelease plan`: the budget allocation of a config and what its (ε, δ) covers, reading
nothing of the data but the inputs' identity (the independence check of
:mod:`schemas.input_independence`, on the input files present)."""

from __future__ import annotations

from schemas.input_independence import InputFile
from schemas.release_config import ReleaseConfig
from tasks.context import budget_plan

INVARIANT_TEXT = {
    "puma_household_counts": "the number of households in every PUMA (and so in every state and the nation) is released exactly",
}
PUBLIC_STRUCTURE = ("the geography (the declared states, by default those of the private input files, and each one's PUMAs "
                    "from the published PUMA list) and the domain spec are public")


def invariants_statement(cfg: ReleaseConfig) -> dict:
    """What the guarantee covers, for the manifest and the plan: the (ε, δ) holds for every
    released number except the declared invariants."""
    return {
        "declared": list(cfg.invariants),
        "statement": ("the (epsilon, delta) guarantee holds for everything released"
                      if not cfg.invariants else
                      "the (epsilon, delta) guarantee holds for everything released except these invariants: "
                      + "; ".join(f"{i} ({INVARIANT_TEXT[i]})" for i in cfg.invariants)),
        "public_structure": PUBLIC_STRUCTURE,
    }


def inputs_line(cfg: ReleaseConfig, checked: list[InputFile]) -> str:
    """How many of the config's input files passed the independence check (those not found here are not checked)."""
    listed = sum(1 + (spec.housing is not None) for spec in cfg.private + cfg.public)
    line = (f"inputs: {len(checked)} of {listed} files checked for independence (no file or content listed twice, "
            "no public input covering a private state in a shared survey year)")
    return line + (f"; {listed - len(checked)} not found here, not checked" if len(checked) < listed else "")


def render_plan(cfg: ReleaseConfig, checked: list[InputFile] | None = None) -> str:
    """The plan's text; with ``checked`` (the input files the independence check passed), a line saying so."""
    plan = budget_plan(cfg)
    b = cfg.budget
    target = f"rho = {b.rho}" if b.rho is not None else f"(epsilon, delta) = ({b.epsilon}, {b.delta:g}) converted to rho by {b.conversion}"
    inv = invariants_statement(cfg)
    head = [
        f"release {cfg.name}: privacy unit {cfg.privacy_unit}, synthesizer {cfg.synthesizer}",
        f"budget: {target}",
        f"invariants: {', '.join(cfg.invariants) if cfg.invariants else 'none'}",
        *([] if checked is None else [inputs_line(cfg, checked)]),
        *([f"synthesis split: public_simulation (the state_synthesis + puma_synthesis shares' sum, "
           f"{cfg.allocation.stages['state_synthesis'] + cfg.allocation.stages['puma_synthesis']:g}, is divided between the state and "
           "the PUMA level at run time by the expected error simulated on the public data; the table shows the shares before that division)"]
          if cfg.allocation.synthesis_split == "public_simulation" and cfg.synthesizer == "prior_update" else []),
        "",
    ]
    tail = ["", f"guarantee: {inv['statement']}; {inv['public_structure']}."]
    return "\n".join(head) + plan.render_table() + "\n".join(tail)
