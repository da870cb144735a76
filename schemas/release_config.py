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

from engine.adaptive import SELECT_FIRST, AdaptiveRounds
from engine.domain import Domain
from engine.errors import DPReleaseError
from engine.geography import LEVELS, Geography
from engine.hgem.settings import HGEMSettings
from engine.prior_strength import DEFAULT_CANDIDATES
from engine.synthesis_settings import SynthesisSettings
from engine.workload_selection import PUMA_ATTRIBUTES, PUMA_ATTRIBUTES_MAX
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

    ``synthesis_split``: ``fixed`` spends the ``state_synthesis`` and ``puma_synthesis`` shares as
    given; ``public_simulation`` keeps their sum and divides it between the state and the PUMA level
    at run time by the expected error simulated on the public data (``engine.budget_split``; no
    privacy cost), recorded in the manifest."""

    stages: dict[str, float]
    levels: dict[str, dict[str, float]]
    synthesis_split: Literal["fixed", "public_simulation"] = "fixed"

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
        if self.synthesis_split == "public_simulation" and min(self.stages.get("state_synthesis", 0), self.stages.get("puma_synthesis", 0)) <= 0:
            raise ValueError("synthesis_split public_simulation divides the state_synthesis and puma_synthesis shares: both must be positive")
        if self.synthesis_split == "public_simulation" and (
                {k: v for k, v in self.levels.get("state_synthesis", {}).items() if v} != {"state": 1}
                or {k: v for k, v in self.levels.get("puma_synthesis", {}).items() if v} != {"puma": 1}):
            raise ValueError("synthesis_split public_simulation needs levels state_synthesis {state: 1.0} and puma_synthesis {puma: 1.0}")
        return self

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
                "count_of_counts.group_counts was removed: household counts are private (measured) by default; "
                "to hold PUMA household counts exact, declare `invariants: [puma_household_counts]` at the top level")
        return v


AdaptiveLevel = Literal["state", "puma"]


class AdaptiveSpec(_Strict):
    """Adaptive measurement rounds after the public-chosen workloads (``engine.adaptive``): at each
    level in ``levels``, ``rounds`` workloads chosen by the exponential mechanism where the model is
    most wrong, measured with ``share`` of the node's ρ (each round: ``select_share`` of its ρ to the
    selection); candidates on 2..``max_attributes`` attributes with at most ``max_cells`` cells, scored at normalised
    nodes on the plain counts of each household's first ``select_first`` persons."""

    rounds: int = Field(default=0, ge=0, le=1000)
    share: float = Field(default=0.0, ge=0, lt=1)
    select_share: float = Field(default=0.1, gt=0, lt=1)
    levels: list[AdaptiveLevel] = ["state"]  # pydantic copies the default per instance
    max_cells: int = Field(default=1024, ge=2)
    max_attributes: int = Field(default=3, ge=2, le=4)
    select_first: int = Field(default=SELECT_FIRST, ge=1, le=20, description=(
        "normalised workloads: the candidates are scored on the plain counts of each household's first this many persons "
        "(the selection's L1 sensitivity under the household unit; engine.adaptive)"))

    @model_validator(mode="after")
    def _rounds_need_budget(self) -> AdaptiveSpec:
        if (self.rounds == 0) != (self.share == 0):
            raise ValueError("synthesis.adaptive: rounds > 0 needs share > 0, and share > 0 needs rounds > 0")
        return self

    def plan(self, level: str) -> AdaptiveRounds | None:
        """The engine's plan at ``level`` (None: no rounds there); shares as exact decimals."""
        if self.rounds == 0 or level not in self.levels:
            return None
        return AdaptiveRounds(self.rounds, Fraction(str(self.share)), Fraction(str(self.select_share)), self.max_cells, self.max_attributes,
                              self.select_first)


class SynthesisSpec(_Strict):
    """Prior-update settings: ``map`` (noise-aware, default) or ``ide`` (Tao et al.'s exact rule).
    ``prior_strength`` is also the strength of H-GEM's relative-entropy prior to its public fit."""

    update_rule: Literal["map", "ide"] = "map"
    prior_strength: float = Field(default=0.1, gt=0,
                                  description="MAP rule and H-GEM: α as a fraction of the node's households")
    sweeps: int = Field(default=3, ge=1, le=100, description="IDE rule: sweeps over the workloads")
    person_first: int = Field(default=0, ge=0, description="person-level workloads count the first this many "
                              "persons of each household (sensitivity person_first instead of M under the "
                              "household unit, without normalise); 0: every person")
    normalise: bool = Field(default=True, description="every synthesis workload but the partitions measures each "
                            "household's contribution rescaled to one household's worth in L2 (engine.queries.Workload."
                            "normalised): L2 sensitivity one household, every person counted; false: plain counts")
    complete_pairs: bool = Field(default=True, description="the state level also measures every two-way marginal of the "
                                 "persons that the mutual-information selection leaves out (each pair of person attributes, and "
                                 "the size with each person attribute; engine.workload_selection.pair_completion), fitted by the "
                                 "state's final fit (the adaptive rounds rank their candidates without them): the prior's weak "
                                 "pairs are where a private state unlike the public ones differs; the cost is the state's final fit's "
                                 "and its error estimates' time on the extra cells; false: the selection's cliques only")
    puma_attributes: int = Field(default=PUMA_ATTRIBUTES, ge=1, le=32, description="PUMA level: the one-way marginals of this many "
                                 "attributes (at least this many under puma_attributes_rule signal_to_noise), those that vary most "
                                 "between the PUMAs of a public state (engine.workload_selection.select_workloads' puma_max_attributes)")
    puma_attributes_rule: Literal["signal_to_noise", "fixed"] = Field(
        default="signal_to_noise", description="signal_to_noise: more ranked PUMA attributes than puma_attributes, up to "
        "puma_attributes_max, while the added one-way marginal's expected noise at the PUMA level's rho is at most its "
        "between-PUMA variation on the public data (engine.puma_attributes; recorded in the manifest's "
        "synthesizer.puma_attributes); fixed: exactly puma_attributes")
    puma_attributes_max: int = Field(default=PUMA_ATTRIBUTES_MAX, ge=1, le=32,
                                     description="signal_to_noise: the most PUMA attributes the rule may choose")
    prior_strength_rule: Literal["empirical_bayes", "fixed"] = Field(
        default="empirical_bayes", description="the state update's prior strength: empirical_bayes (chosen among "
        "prior_strength_candidates from the state's own noisy measurements, engine.prior_strength) or fixed (prior_strength)")
    prior_strength_candidates: list[float] = Field(default_factory=lambda: list(DEFAULT_CANDIDATES), min_length=2,
                                                   description="empirical_bayes: the relative prior strengths to choose from")
    prior_strength_floor: Literal["public_simulation", "none"] = Field(
        default="public_simulation", description="empirical_bayes: public_simulation holds the choice at or above the weakest "
        "candidate any public state, played as the private one at the run's budget, is best with on held-out marginals "
        "(engine.strength_floor; no privacy cost, recorded in the manifest's synthesizer.prior_strength_floor); none: no floor")

    @model_validator(mode="after")
    def _puma_attribute_bounds(self) -> SynthesisSpec:
        if self.puma_attributes_rule == "signal_to_noise" and self.puma_attributes_max < self.puma_attributes:
            raise ValueError(f"synthesis.puma_attributes_max ({self.puma_attributes_max}) must be at least "
                             f"synthesis.puma_attributes ({self.puma_attributes})")
        return self

    def puma_candidates(self) -> int:
        """How many ranked PUMA attributes the workload selection keeps: all the rule may choose from."""
        return self.puma_attributes_max if self.puma_attributes_rule == "signal_to_noise" else self.puma_attributes

    @field_validator("prior_flips")
    @classmethod
    def _distinct_flips(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and len(set(v)) != len(v):
            raise ValueError(f"synthesis.prior_flips names an attribute twice: {v}")
        return v

    @field_validator("prior_strength_candidates")
    @classmethod
    def _positive_candidates(cls, v: list[float]) -> list[float]:
        if any(not x > 0 for x in v):
            raise ValueError("synthesis.prior_strength_candidates must all be > 0")
        return v
    prior_flips: list[str] | None = Field(
        default=None, description="binary person attributes whose public share may be far from the "
        "private state's: the support also holds every public household with the attribute flipped (its householder attributes "
        "with it), weighed into the state prior by the least-squares fit of the prior's answers to the state's noisy "
        "measurements, and only where that fit gains (engine.prior_mixture; post-processing, no privacy cost; recorded in the "
        "state posterior's diagnostics); absent: every binary person attribute the domain spec can flip; []: the public households alone")
    sampling: Literal["balanced", "systematic"] = Field(
        default="balanced", description="how a PUMA's households are drawn from its posterior: balanced (the draw's one- and "
        "two-attribute marginals and the persons' three-attribute ones held to the posterior's, a state's PUMAs with error "
        "diffusion, engine.balanced_sampling) or systematic (along the household order)")
    level_consistency: Literal["rake", "none"] = Field(
        default="rake", description="rake: a state's PUMA posteriors tilted together so that their sum holds to the state posterior "
        "on the state's measured workloads (engine.level_consistency); none: each PUMA as its own fit left it")
    pumas_inform_state: bool = Field(
        default=True, description="the state's fit also takes in its PUMAs' measurements, each PUMA workload's noisy answers summed "
        "over the state's PUMAs with their variances summed (engine.level_consistency.children_sum; post-processing, no privacy "
        "cost); false: the state posterior from the state's own measurements only")
    adaptive: AdaptiveSpec = Field(default_factory=AdaptiveSpec)


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


class ReleaseConfig(_Strict):
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
    allocation: AllocationSpec
    synthesizer: Literal["public_baseline", "prior_update", "hgem"] = "prior_update"
    synthesis: SynthesisSpec = Field(default_factory=SynthesisSpec)
    hgem: HGEMSpec = Field(default_factory=HGEMSpec)
    count_of_counts: CountOfCountsSpec = Field(default_factory=CountOfCountsSpec)
    household_rules: HouseholdRulesSpec = Field(default_factory=HouseholdRulesSpec)
    output_dir: str = "releases"
    work_dir: str = "work"
    sampling_seed: int | None = None  # post-processing sampling only; noise never uses seeds
    weights: WeightsSpec | None = None
    invariants: list[Literal["puma_household_counts"]] = Field(
        default_factory=list,
        description="exact statistics released without noise (the DP guarantee holds for everything except these)")

    @field_validator("name")
    @classmethod
    def _name(cls, v):
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,79}", v):
            raise ValueError("name must be 1-80 characters of letters, digits, '.', '_' or '-'")
        return v

    @model_validator(mode="after")
    def _stages_consistent(self):
        st = self.allocation.stages
        if st.get("count_of_counts", 0) > 0:
            lv = self.allocation.levels.get("count_of_counts", {})
            if not all(lv.get(x, 0) > 0 for x in LEVELS):
                raise ValueError("allocation.levels.count_of_counts needs a positive share for nation, state and puma (top-down needs every level measured)")
        if self.allocation.synthesis_split == "public_simulation" and self.synthesizer == "hgem":
            raise ValueError("allocation.synthesis_split public_simulation models the prior update; under synthesizer hgem give the shares (fixed)")
        if len(set(self.invariants)) != len(self.invariants):
            raise ValueError("invariants: each invariant at most once")
        if st.get("group_counts", 0) > 0 and self.allocation.levels.get("group_counts", {}).get("puma", 0) <= 0:
            raise ValueError("allocation.levels.group_counts needs a positive puma share (the PUMA household counts are the leaves of the count hierarchy)")
        if "puma_household_counts" not in self.invariants and st.get("count_of_counts", 0) <= 0 and st.get("group_counts", 0) <= 0:
            raise ValueError(
                "household counts are private: give the count_of_counts or the group_counts stage a share (they measure them), "
                "or declare `invariants: [puma_household_counts]` to hold them exact")
        if self.synthesizer == "prior_update":
            for stage, level in (("state_synthesis", "state"), ("puma_synthesis", "puma")):
                if st.get(stage, 0) <= 0 or self.allocation.levels.get(stage, {}).get(level, 0) <= 0:
                    raise ValueError(f"synthesizer prior_update needs a positive allocation for {stage}.{level}")
        if self.synthesizer == "hgem":
            if self.synthesis.person_first:
                raise ValueError("synthesizer hgem: H-GEM's mixture answers count every person of a household; "
                                 "set synthesis.person_first: 0 (its workloads are never normalised either)")
            for stage, level in (("hgem", "state"), ("puma_synthesis", "puma")):
                if st.get(stage, 0) <= 0 or self.allocation.levels.get(stage, {}).get(level, 0) <= 0:
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
        """The run's synthesis settings (:class:`engine.synthesis_settings.SynthesisSettings`), built
        once from the config; ``domain``: the encoded data's (the flips' attributes are checked
        against it, :meth:`schemas.domain_spec.DomainSpec.prior_flips`)."""
        s = self.synthesis
        spec = load_domain_spec(self.domain_path())
        flips = spec.flippable(domain) if s.prior_flips is None else spec.prior_flips(s.prior_flips, domain)
        return SynthesisSettings(prior_strength=s.prior_strength, strength_candidates=tuple(s.prior_strength_candidates),
                                 adaptive=s.adaptive.plan("state"), puma_attributes=s.puma_attributes,
                                 puma_attributes_max=s.puma_attributes_max, prior_flips=flips)

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
