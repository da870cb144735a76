"""The release config (``deploy/releases/*.yaml``) as a validated pydantic model.

Relative paths: input paths are relative to ``data_root``; ``data_root``, ``output_dir`` and
``work_dir`` are relative to the current working directory (the repository root when run through
the README's commands). ``data_root`` defaults to ``$DPRELEASE_DATA`` or ``../shared/data``.
:func:`load_config` resolves them to absolute paths once, where the config is loaded (the client),
so tasks on Dask workers started elsewhere use the client's locations (``ReleaseConfig.resolved``).
"""

from __future__ import annotations

import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.data import LEVELS, Domain, Geography
from engine.errors import DPReleaseError
from engine.hgem.settings import HGEMSettings
from engine.synthesis import DEFAULT_ADAPTIVE, AdaptiveRounds, SynthesisSettings
from schemas.domain_spec import domain_spec_path, load_domain_spec
from schemas.geography import DEFAULT_PUMA_LIST, PumaListError, declared, load_puma_list, puma_list_path

STAGES = ("count_of_counts", "state_synthesis", "puma_synthesis", "hgem", "group_counts")


class ConfigError(DPReleaseError, ValueError):
    pass


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputSpec(_Strict):
    path: str
    layout: Literal["auto", "pums2017", "pums_legacy"] = "auto"
    housing: str | None = None  # legacy layout: the housing file beside the person file


class WeightsSpec(_Strict):
    """Household weights calibrated to public totals (``tasks.weights``): ``totals`` is a CSV of
    public household and person totals per PUMA and optionally per state (``schemas.weight_totals``),
    relative to ``data_root`` like the inputs. Without it the microdata are an unweighted sample."""

    totals: str


class BudgetSpec(_Strict):
    """Total privacy budget: ρ (zCDP) directly, or a target (ε, δ) converted to ρ."""

    rho: float | None = Field(default=None, gt=0)
    epsilon: float | None = Field(default=None, gt=0)
    delta: float = Field(default=1e-10, gt=0, lt=1)
    conversion: Literal["cks", "simple"] = "cks"

    @model_validator(mode="after")
    def _one(self):
        if (self.rho is None) == (self.epsilon is None):
            raise ValueError("give exactly one of budget.rho or budget.epsilon (with budget.delta)")
        return self


class AllocationSpec(_Strict):
    """Shares of the total ρ per stage, and per stage the shares of its levels.

    ``synthesis_split``: ``public_simulation`` keeps the ``state_synthesis`` and ``puma_synthesis``
    shares' sum and divides it between the state and the PUMA level at run time by the expected
    error simulated on the public data (``engine.synthesis``; no privacy cost), recorded in the
    manifest; ``fixed`` spends the shares as given. Absent: ``public_simulation`` under the prior
    update (the split it models), ``fixed`` under the other synthesizers."""

    stages: dict[str, float]
    levels: dict[str, dict[str, float]]
    synthesis_split: Literal["fixed", "public_simulation"] | None = None

    @field_validator("stages")
    @classmethod
    def _stages(cls, v):
        for s, share in v.items():
            if s not in STAGES:
                raise ValueError(f"unknown stage {s!r}; stages are {STAGES}")
            if share < 0:
                raise ValueError(f"stage {s}: share must be >= 0")
        if abs(sum(v.values()) - 1) > 1e-9:
            raise ValueError(f"stage shares must sum to 1, got {sum(v.values())}")
        return v

    @model_validator(mode="after")
    def _levels(self):
        for s, lv in self.levels.items():
            if s not in self.stages:
                raise ValueError(f"levels given for stage {s!r} that has no stage share")
            for name, share in lv.items():
                if name not in LEVELS:
                    raise ValueError(f"stage {s}: unknown level {name!r}; levels are {LEVELS}")
                if share < 0:
                    raise ValueError(f"stage {s}, level {name}: share must be >= 0")
            if abs(sum(lv.values()) - 1) > 1e-9:
                raise ValueError(f"stage {s}: level shares must sum to 1, got {sum(lv.values())}")
        for s, share in self.stages.items():
            if share > 0 and s not in self.levels:
                raise ValueError(f"stage {s} has a share but no level allocation")
        return self

    def check_split(self) -> None:
        """Raise ValueError unless a ``public_simulation`` split has the two synthesis shares to divide."""
        if self.synthesis_split == "public_simulation" and min(self.stages.get("state_synthesis", 0), self.stages.get("puma_synthesis", 0)) <= 0:
            raise ValueError("synthesis_split public_simulation divides the state_synthesis and puma_synthesis shares: both must be positive")
        if self.synthesis_split == "public_simulation" and (
                {k: v for k, v in self.levels.get("state_synthesis", {}).items() if v} != {"state": 1}
                or {k: v for k, v in self.levels.get("puma_synthesis", {}).items() if v} != {"puma": 1}):
            raise ValueError("synthesis_split public_simulation needs levels state_synthesis {state: 1.0} and puma_synthesis {puma: 1.0}; "
                             "or give synthesis_split: fixed")

    def with_state_fraction(self, fraction: Fraction) -> AllocationSpec:
        """The allocation with the synthesis shares' sum split ``fraction`` : 1 − ``fraction``
        between ``state_synthesis`` and ``puma_synthesis`` (computed on the shares' decimals, so
        that decimal shares and fractions stay decimals and the plan still sums to 1)."""
        total = Fraction(str(self.stages["state_synthesis"])) + Fraction(str(self.stages["puma_synthesis"]))
        state = total * Fraction(fraction)
        return self.model_copy(update={"stages": {**self.stages, "state_synthesis": float(state), "puma_synthesis": float(total - state)}})


class GeographySpec(_Strict):
    """The release's geography, declared from public information (``schemas.geography``):
    ``states``, the states released (FIPS codes; absent: the states of the private files, taken as
    declared); ``pumas``, the public PUMA list giving each state's PUMAs (a shipped list's name or a
    ``.yaml`` file in its format, relative to ``data_root``). ``state`` and ``puma``: the source
    columns of the two levels."""

    state: str = "ST"
    puma: str = "PUMA"
    states: list[int] | None = Field(default=None, min_length=1)
    pumas: str = DEFAULT_PUMA_LIST

    @field_validator("states")
    @classmethod
    def _distinct_states(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"geography.states names a state twice: {v}")
        return v


class HouseholdRulesSpec(_Strict):
    """The ingestion rules (``schemas.ingestion.HouseholdRules``). Every combination with either
    privacy unit is accepted: each is charged its worst-case neighbour (``docs/privacy.md``), and
    under the person unit a housing unit without exactly one householder is excluded."""

    max_household_size: int = Field(default=8, ge=1, le=20)
    group_quarters: Literal["exclude", "single_person_households"] = "exclude"
    oversize: Literal["clip", "exclude"] = "clip"


class AttributesSpec(_Strict):
    """Optional subset of the domain spec's attributes (NP is always kept)."""

    group: list[str] | None = None
    person: list[str] | None = None


class CountOfCountsSpec(_Strict):
    """The count-of-counts stage (runs when the allocation gives it a share): households of size
    ≥ k measured per node, estimated (isotonic L1) and made consistent top-down. Household counts
    come from the same measurements unless ``invariants`` holds them exact."""

    consistency: Literal["weighted", "average", "leaves"] = "weighted"
    mechanism: Literal["gaussian", "laplace"] = "gaussian"

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, v):
        if isinstance(v, dict) and "group_counts" in v:
            raise ValueError(
                "advanced.count_of_counts.group_counts was removed: household counts are private (measured) by default; "
                "to hold PUMA household counts exact, declare `invariants: [puma_household_counts]` at the top level")
        return v


_SYNTHESIS = SynthesisSettings()  # the synthesis defaults live in the engine, once


class AdaptiveSpec(_Strict):
    """The state level's adaptive rounds after the public-chosen workloads (``engine.synthesis``):
    ``rounds`` workloads chosen by the exponential mechanism where the state posterior is most
    wrong, measured with ``share`` of the state's synthesis ρ; ``rounds: 0``: none."""

    rounds: int = Field(default=DEFAULT_ADAPTIVE.rounds, ge=0, le=1000)
    share: float = Field(default=float(DEFAULT_ADAPTIVE.share), gt=0, lt=1)

    def plan(self) -> AdaptiveRounds | None:
        """The engine's rounds (None: no rounds); the share as the exact decimal written."""
        return AdaptiveRounds(self.rounds, Fraction(str(self.share))) if self.rounds else None


class SynthesisSpec(_Strict):
    """The expert overrides of :class:`engine.synthesis.SynthesisSettings` (whose defaults
    these are). ``prior_strength``: the MAP prior's strength α as a fraction of the node's households
    (also H-GEM's relative-entropy prior); ``adaptive``: the state level's adaptive rounds;
    ``prior_flips``: the person attributes whose relabelled public households may widen the state
    prior (``engine.synthesis``: a binary one flipped, a multi-valued one's two codes swapped
    where the state's measurements ask; post-processing, no privacy cost) — absent: every person
    attribute the domain spec can relabel (:meth:`schemas.domain_spec.DomainSpec.flippable`), ``[]``: none."""

    prior_strength: float = Field(default=_SYNTHESIS.prior_strength, gt=0)
    adaptive: AdaptiveSpec = Field(default_factory=AdaptiveSpec)
    prior_flips: list[str] | None = None

    @field_validator("prior_flips")
    @classmethod
    def _distinct_flips(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"advanced.synthesis.prior_flips names an attribute twice: {v}")
        return v


_HGEM = HGEMSettings()  # the defaults live in the engine, once


class HGEMSpec(_Strict):
    """H-GEM settings (``synthesizer: hgem``): :class:`engine.hgem.settings.HGEMSettings`, whose
    docstring explains each; ``alpha`` and ``initial_share`` are read as the decimals written
    (0.8 is exactly 4/5 in the budget split)."""

    rounds: int = Field(default=_HGEM.rounds, ge=0, description="adaptive rounds after the initial measurements")
    alpha: float = Field(default=float(_HGEM.alpha), gt=0, lt=1, description="selection share of each round's rho")
    initial_share: float = Field(default=float(_HGEM.initial_share), ge=0, le=1,
                                 description="share of the state's rho for the public-selected state workloads")
    kway: int = Field(default=_HGEM.kway, ge=1)
    kway_per_group_count: int | None = Field(default=_HGEM.kway_per_group_count, ge=1)
    workload_seed: int = _HGEM.workload_seed
    batch_size: int = Field(default=_HGEM.batch_size, ge=1, description="mixture components")
    z_dim: int = Field(default=_HGEM.z_dim, ge=1)
    hidden: list[int] = Field(default_factory=lambda: list(_HGEM.hidden), min_length=1)
    lr: float = Field(default=_HGEM.lr, gt=0)
    max_update_steps: int = Field(default=_HGEM.max_update_steps, ge=0)
    initial_update_steps: int = Field(default=_HGEM.initial_update_steps, ge=0)
    pretrain_steps: int = Field(default=_HGEM.pretrain_steps, ge=0)
    support_per_household: int = Field(default=_HGEM.support_per_household, ge=1)
    torch_threads: int | None = Field(default=_HGEM.torch_threads, ge=1)

    @model_validator(mode="after")
    def _settings(self):
        self.settings()  # the engine's own checks (HGEMSettingsError is a ValueError)
        return self

    def settings(self) -> HGEMSettings:
        d = self.model_dump()
        return HGEMSettings(**{**d, "alpha": Fraction(str(self.alpha)), "initial_share": Fraction(str(self.initial_share)),
                               "hidden": tuple(self.hidden)})


Synthesizer = Literal["public_baseline", "prior_update", "hgem"]

_COUNT_LEVELS = {"nation": 0.2, "state": 0.3, "puma": 0.5}
# The allocation a config gets without ``advanced.allocation``, per synthesizer. Prior update:
# household counts take 10 % (a size histogram's sum is K times noisier than a direct count, so half
# measures the counts alone, merged with the histograms' sums by inverse variance), the synthesis
# 90 %, divided between the state and the PUMA level by the public simulation (the best split moves
# with the budget, which no fixed split follows; the 0.7/0.2 written here is only its sum).
# H-GEM: its state model, the prior update per PUMA, the household counts measured per PUMA.
# Public baseline: nothing is synthesised from private data, the whole budget measures the counts.
DEFAULT_ALLOCATIONS: dict[str, AllocationSpec] = {
    "prior_update": AllocationSpec(
        stages={"group_counts": 0.05, "count_of_counts": 0.05, "state_synthesis": 0.7, "puma_synthesis": 0.2},
        levels={"group_counts": _COUNT_LEVELS, "count_of_counts": _COUNT_LEVELS, "state_synthesis": {"state": 1.0},
                "puma_synthesis": {"puma": 1.0}},
        synthesis_split="public_simulation"),
    "hgem": AllocationSpec(
        stages={"group_counts": 0.1, "hgem": 0.5, "puma_synthesis": 0.4},
        levels={"group_counts": {"puma": 1.0}, "hgem": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}}, synthesis_split="fixed"),
    "public_baseline": AllocationSpec(stages={"group_counts": 1.0}, levels={"group_counts": {"puma": 1.0}}, synthesis_split="fixed"),
}


class AdvancedSpec(_Strict):
    """What an expert may override; each key absent takes its default, defined once (the
    allocation's in :data:`DEFAULT_ALLOCATIONS`, the synthesis' in
    :class:`engine.synthesis.SynthesisSettings`, H-GEM's in
    :class:`engine.hgem.settings.HGEMSettings`)."""

    allocation: AllocationSpec | None = None
    synthesis: SynthesisSpec = Field(default_factory=SynthesisSpec)
    hgem: HGEMSpec = Field(default_factory=HGEMSpec)
    count_of_counts: CountOfCountsSpec = Field(default_factory=CountOfCountsSpec)


SETTLED = "removed (settled: "
_ADAPTIVE_SETTLED = SETTLED + "the adaptive rounds run at the state level with the engine's selection settings)"
_STRENGTH_SETTLED = SETTLED + "empirical Bayes, held to the public simulation's floor, always chooses the state's prior strength)"
_PUMA_SETTLED = SETTLED + "the signal-to-noise rule always chooses the PUMA attributes)"
# keys of earlier configs, each with why it is gone: a config still using one is refused with the reason
RETIRED_SYNTHESIS = {
    "update_rule": SETTLED + "the MAP update always runs)",
    "sweeps": SETTLED + "the MAP update always runs; sweeps were the IDE rule's)",
    "person_first": SETTLED + "synthesis workloads count every person of a household)",
    "normalise": SETTLED + "the prior update's workloads are always normalised)",
    "complete_pairs": SETTLED + "the state level always measures the person pairs the selection leaves out)",
    "puma_attributes": _PUMA_SETTLED,
    "puma_attributes_rule": _PUMA_SETTLED,
    "puma_attributes_max": _PUMA_SETTLED,
    "prior_strength_rule": _STRENGTH_SETTLED,
    "prior_strength_candidates": _STRENGTH_SETTLED,
    "prior_strength_floor": _STRENGTH_SETTLED,
    "pumas_inform_state": SETTLED + "the PUMAs' sums always inform the state's fit)",
    "level_consistency": SETTLED + "the PUMA posteriors are always raked to the state)",
    "sampling": SETTLED + "balanced sampling always runs)",
}
RETIRED_ADAPTIVE = {k: _ADAPTIVE_SETTLED for k in ("select_share", "max_cells", "max_attributes", "select_first", "levels")}
MOVED = ("allocation", "synthesis", "hgem", "count_of_counts")


def retired_keys(raw: dict) -> list[str]:
    """One ``key: why`` line per key of ``raw`` (a config as read) that was moved or removed."""
    lines = [f"{k}: moved to advanced.{k}" for k in MOVED if k in raw]
    advanced = raw.get("advanced")
    for prefix, synthesis in (("synthesis", raw.get("synthesis")),
                              ("advanced.synthesis", advanced.get("synthesis") if isinstance(advanced, dict) else None)):
        if not isinstance(synthesis, dict):
            continue
        lines += [f"{prefix}.{k}: {why}" for k, why in RETIRED_SYNTHESIS.items() if k in synthesis]
        adaptive = synthesis.get("adaptive")
        if isinstance(adaptive, dict):
            lines += [f"{prefix}.adaptive.{k}: {why}" for k, why in RETIRED_ADAPTIVE.items() if k in adaptive]
    return lines


class ReleaseConfig(_Strict):
    """A release: what to read, its domain and privacy unit, the budget and the synthesizer; the
    operational keys (geography, household rules, weights, locations, seed) and ``advanced`` are optional."""

    name: str
    description: str = ""
    data_root: str | None = None
    private: list[InputSpec] = Field(min_length=1)
    public: list[InputSpec] = Field(min_length=1)
    domain: str = "acs_pums"
    geography: GeographySpec = Field(default_factory=GeographySpec)
    attributes: AttributesSpec = Field(default_factory=AttributesSpec)
    privacy_unit: Literal["household", "person"] = "household"
    budget: BudgetSpec
    synthesizer: Synthesizer = "prior_update"
    household_rules: HouseholdRulesSpec = Field(default_factory=HouseholdRulesSpec)
    output_dir: str = "releases"
    work_dir: str = "work"
    sampling_seed: int | None = None  # post-processing sampling only; noise never uses seeds
    weights: WeightsSpec | None = None
    invariants: list[Literal["puma_household_counts"]] = Field(
        default_factory=list,
        description="exact statistics released without noise (the DP guarantee holds for everything except these)")
    advanced: AdvancedSpec = Field(default_factory=AdvancedSpec)

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, v):
        lines = retired_keys(v) if isinstance(v, dict) else []
        if lines:
            raise ValueError("; ".join(lines))
        return v

    @property
    def allocation(self) -> AllocationSpec:
        """The run's allocation: ``advanced.allocation``, else the synthesizer's default
        (:data:`DEFAULT_ALLOCATIONS`), with its synthesis split resolved."""
        a = self.advanced.allocation or DEFAULT_ALLOCATIONS[self.synthesizer]
        if a.synthesis_split is not None:
            return a
        return a.model_copy(update={"synthesis_split": "public_simulation" if self.synthesizer == "prior_update" else "fixed"})

    def with_allocation(self, allocation: AllocationSpec) -> ReleaseConfig:
        """The config with ``allocation`` as its ``advanced.allocation``."""
        return self.model_copy(update={"advanced": self.advanced.model_copy(update={"allocation": allocation})})

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}", v):
            raise ValueError("name must be 1-80 characters of letters, digits, '.', '_' or '-'")
        return v

    @model_validator(mode="after")
    def _stages_consistent(self):
        alloc = self.allocation
        st = alloc.stages
        if st.get("count_of_counts", 0) > 0:
            lv = alloc.levels.get("count_of_counts", {})
            if not all(lv.get(x, 0) > 0 for x in LEVELS):
                raise ValueError("advanced.allocation.levels.count_of_counts needs a positive share for nation, state and puma (top-down needs every level measured)")
        if alloc.synthesis_split == "public_simulation" and self.synthesizer != "prior_update":
            raise ValueError(f"advanced.allocation.synthesis_split public_simulation models the prior update; under synthesizer {self.synthesizer} "
                             "the shares are spent as given (fixed)")
        alloc.check_split()
        if len(set(self.invariants)) != len(self.invariants):
            raise ValueError("invariants: each invariant at most once")
        if st.get("group_counts", 0) > 0 and alloc.levels.get("group_counts", {}).get("puma", 0) <= 0:
            raise ValueError("advanced.allocation.levels.group_counts needs a positive puma share (the PUMA household counts are the leaves of the count hierarchy)")
        if "puma_household_counts" not in self.invariants and st.get("count_of_counts", 0) <= 0 and st.get("group_counts", 0) <= 0:
            raise ValueError(
                "household counts are private: give the count_of_counts or the group_counts stage a share (they measure them), "
                "or declare `invariants: [puma_household_counts]` to hold them exact")
        if self.synthesizer == "prior_update":
            for stage, level in (("state_synthesis", "state"), ("puma_synthesis", "puma")):
                if st.get(stage, 0) <= 0 or alloc.levels.get(stage, {}).get(level, 0) <= 0:
                    raise ValueError(f"synthesizer prior_update needs a positive allocation for {stage}.{level}")
        if self.synthesizer == "hgem":
            for stage, level in (("hgem", "state"), ("puma_synthesis", "puma")):
                if st.get(stage, 0) <= 0 or alloc.levels.get(stage, {}).get(level, 0) <= 0:
                    raise ValueError(f"synthesizer hgem needs a positive allocation for {stage}.{level} (H-GEM per state, then the prior update per PUMA)")
        return self

    # -- resolved paths --------------------------------------------------------------------
    def resolved(self) -> ReleaseConfig:
        """The config with every location absolute, resolved once where it is loaded (the
        client): ``data_root`` (from the config, ``$DPRELEASE_DATA`` or ``../shared/data``),
        ``output_dir``, ``work_dir`` and a domain given as a path. Tasks on Dask workers, whose
        working directory and environment may differ, then see the client's locations."""
        update = {"data_root": str(self.data_root_path()), "output_dir": str(Path(self.output_dir).expanduser().resolve()),
                  "work_dir": str(Path(self.work_dir).expanduser().resolve())}
        if Path(self.domain).suffix in (".yaml", ".yml"):
            update["domain"] = str(self.domain_path())
        return self.model_copy(update=update)

    def data_root_path(self) -> Path:
        root = self.data_root or os.environ.get("DPRELEASE_DATA") or "../shared/data"
        return Path(root).expanduser().resolve()

    def input_path(self, spec: InputSpec) -> Path:
        p = Path(spec.path).expanduser()
        return p if p.is_absolute() else self.data_root_path() / p

    def housing_path(self, spec: InputSpec) -> Path | None:
        if spec.housing is None:
            return None
        p = Path(spec.housing).expanduser()
        return p if p.is_absolute() else self.data_root_path() / p

    def weight_totals_path(self) -> Path | None:
        if self.weights is None:
            return None
        p = Path(self.weights.totals).expanduser()
        return p if p.is_absolute() else self.data_root_path() / p

    def release_dir(self) -> Path:
        return Path(self.output_dir).expanduser().resolve() / self.name

    def run_dir(self) -> Path:
        return Path(self.work_dir).expanduser().resolve() / self.name

    def domain_path(self) -> Path:
        return domain_spec_path(self.domain)

    def synthesis_settings(self, domain: Domain) -> SynthesisSettings:
        """The run's synthesis settings (:class:`engine.synthesis.SynthesisSettings`), built
        once from the config; ``domain``: the encoded data's (the flips' attributes are checked
        against it, :meth:`schemas.domain_spec.DomainSpec.prior_flips`)."""
        s = self.advanced.synthesis
        spec = load_domain_spec(self.domain_path())
        flips = spec.flippable(domain) if s.prior_flips is None else spec.prior_flips(s.prior_flips, domain)
        return SynthesisSettings(prior_strength=s.prior_strength, adaptive=s.adaptive.plan(), prior_flips=flips)

    def puma_list(self) -> Geography:
        """Every PUMA of the config's public PUMA list (``geography.pumas``)."""
        return load_puma_list(puma_list_path(self.geography.pumas, self.data_root_path()))


NAME_FIELDS = ("name", "date", "run")


def expand_release_name(template: str, config_name: str, date: str, run: str) -> str:
    """A release name from a template: ``{name}`` is the config's release name, ``{date}`` the run's
    scheduled date (YYYY-MM-DD) and ``{run}`` a short id of the run. A scheduled deployment names
    each run's release this way, so that next year's run (or a second run triggered by hand) does
    not meet the release an earlier run published, while a retry of the same run resumes it."""
    import string

    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    unknown = sorted({f for f in fields if f not in NAME_FIELDS})
    if unknown:
        raise ConfigError(f"release name template {template!r}: unknown field {', '.join('{' + u + '}' for u in unknown)}; "
                          f"it may use {', '.join('{' + f + '}' for f in NAME_FIELDS)}")
    return template.format(name=config_name, date=date, run=run)


def load_config(path: str | Path, name: str | None = None, run: tuple[str, str] | None = None) -> ReleaseConfig:
    """Load and validate a release config; ``name`` overrides the config's release name, and may
    be a template (:func:`expand_release_name`) when ``run`` gives the run's (date, short id)."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the release config ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a release config must be a YAML mapping")
    if name is not None and "{" in name:
        if run is None:
            raise ConfigError(f"release name {name!r} is a template: it names a release only inside a run (dprelease deploy)")
        name = expand_release_name(name, str(raw.get("name", "")), *run)
    if name is not None:
        raw["name"] = name
    retired = retired_keys(raw)
    if retired:
        raise ConfigError("\n".join(f"{path}: {line}" for line in retired))
    try:
        cfg = ReleaseConfig.model_validate(raw).resolved()
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            lines.append(f"{path}: {loc}: {err['msg']}")
        raise ConfigError("\n".join(lines)) from None
    try:  # the geography's public list read, and the declared states found in it, before anything runs
        declared(cfg.puma_list(), cfg.geography.states)
    except PumaListError as e:
        raise ConfigError(f"{path}: {e}") from None
    return cfg


def key_counts(model: type[BaseModel] = ReleaseConfig, section: str = "(top level)") -> dict[str, tuple[int, int]]:
    """The schema's keys per section (``advanced.synthesis``, ...): (keys, required keys), the
    sections nested in ``model`` after it."""
    out = {section: (len(model.model_fields), sum(f.is_required() for f in model.model_fields.values()))}
    for name, field in model.model_fields.items():
        nested = [t for t in (field.annotation, *getattr(field.annotation, "__args__", ()))
                  if isinstance(t, type) and issubclass(t, BaseModel)]
        if nested:
            out.update(key_counts(nested[0], name if section == "(top level)" else f"{section}.{name}"))
    return out


def _print_key_counts() -> None:
    counts = key_counts()
    width = max(map(len, counts))
    print(f"{'section':<{width}}  keys  required")
    for section, (n, required) in counts.items():
        print(f"{section:<{width}}  {n:>4}  {required:>8}")
    print(f"{'all':<{width}}  {sum(n for n, _ in counts.values()):>4}")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m schemas.release_config", description="The release config's schema.")
    parser.add_argument("--keys", action="store_true", help="print how many keys each section of the schema has")
    if parser.parse_args().keys:
        _print_key_counts()
    else:
        parser.print_help()
