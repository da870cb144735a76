"""Every refusal that needs no record of the data, made before anything starts.

``dprelease run`` makes these checks before Prefect starts, ``dprelease plan`` makes them too (on
the input files present), and the release flow makes them again before it writes anything (it is
also called as a library). What they read of the data is only what identifies an input
(:mod:`schemas.input_independence`): paths, hashes, state and survey-year codes.
"""

from __future__ import annotations

from schemas.domain_spec import load_domain_spec
from schemas.input_independence import InputFile, check_inputs, public_states
from schemas.release_config import ConfigError, ReleaseConfig
from schemas.weight_totals import WeightTotals, read_weight_totals
from tasks.run_context import refuse_existing

__all__ = ["preflight", "uses_strength_floor", "weight_totals"]


def preflight(cfg: ReleaseConfig, skip_missing: bool = False) -> list[InputFile]:
    """Refuse what a run would refuse later without reading a record: a release that exists
    already, a domain spec that cannot be read or does not hold the configured attributes or
    prior flips, input files missing or not independent, a split simulation without the two
    public states it plays, and a weight totals file that cannot be read. Returns the input files' identities (``skip_missing``: those present)."""
    refuse_existing(cfg.release_dir())
    spec = load_domain_spec(cfg.domain_path())
    domain = spec.domain(cfg.household_rules.max_household_size)
    try:
        domain = domain.project(cfg.attributes.group, cfg.attributes.person)
    except KeyError as e:
        raise ConfigError(f"attributes: {e.args[0]} (domain {cfg.domain})") from None
    if cfg.synthesizer == "prior_update" and cfg.advanced.synthesis.prior_flips:
        spec.prior_flips(cfg.advanced.synthesis.prior_flips, domain)
    files = check_inputs(cfg, skip_missing)
    weight_totals(cfg)
    if cfg.synthesizer == "prior_update" and cfg.allocation.synthesis_split == "public_simulation":
        present = [f for f in files if f.role == "public" and f.kind == "path"]
        states = public_states(present, cfg.geography.state)
        if len(states) < 2 and len(present) == len(cfg.public):
            raise ConfigError("advanced.allocation.synthesis_split: public_simulation (the prior update's default) plays each public state as private against the "
                              f"others: it needs public inputs of at least two states (they cover {len(states)}); add a public "
                              "state or give an advanced.allocation with synthesis_split: fixed")
    return files


def uses_strength_floor(cfg: ReleaseConfig) -> bool:
    """Whether the run's state strength (empirical Bayes) is held to the public simulation's floor: the prior update's always is."""
    return cfg.synthesizer == "prior_update"


def weight_totals(cfg: ReleaseConfig) -> WeightTotals | None:
    """The public totals of ``weights.totals``, read (and checked) when the config names them."""
    path = cfg.weight_totals_path()
    return None if path is None else read_weight_totals(path)
