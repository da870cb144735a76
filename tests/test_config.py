from pathlib import Path

import pytest
import yaml

from schemas.release_config import DEFAULT_ALLOCATIONS, ConfigError, ReleaseConfig, WeightsSpec, load_config
from tests.conftest import PROJECT_ROOT

DEFAULT = PROJECT_ROOT / "deploy" / "releases" / "acs2018_default.yaml"
SHIPPED = sorted((PROJECT_ROOT / "deploy" / "releases").glob("*.yaml"))


def alloc(r: dict) -> dict:
    """``r``'s ``advanced.allocation``, the prior update's default written out where ``r`` has none."""
    return r.setdefault("advanced", {}).setdefault("allocation", DEFAULT_ALLOCATIONS["prior_update"].model_dump(exclude_none=True))


def advanced(r: dict, section: str) -> dict:
    return r.setdefault("advanced", {}).setdefault(section, {})


def write(tmp_path, mutate) -> Path:
    raw = yaml.safe_load(DEFAULT.read_text())
    mutate(raw)
    p = tmp_path / "cfg.yaml"
    p.write_text(yaml.safe_dump(raw))
    return p


def test_default_config_loads_and_inputs_exist(data_root):
    cfg = load_config(DEFAULT)
    assert cfg.privacy_unit == "household"
    states_private = {Path(i.path).name for i in cfg.private}
    states_public = {Path(i.path).name for i in cfg.public}
    assert not states_private & states_public
    assert len(states_private | states_public) == 12
    for spec in cfg.private + cfg.public:
        assert (data_root / spec.path).exists()


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: alloc(r)["stages"].update(count_of_counts=0.5), "stage shares must sum to 1"),
        (lambda r: alloc(r)["stages"].update(bogus=0.0), "unknown stage 'bogus'"),
        (lambda r: alloc(r)["levels"]["state_synthesis"].update(county=0.0), "unknown level 'county'"),
        (lambda r: r["budget"].update(rho=0.5), "exactly one of budget.rho or budget.epsilon"),
        (lambda r: r["budget"].update(epsilon=-1), "budget.epsilon"),
        (lambda r: r.update(privacy_unit="family"), "privacy_unit"),
        (lambda r: r.update(name="a b/c"), "name must be"),
        (lambda r: r.update(synthesizer="magic"), "synthesizer"),
        (lambda r: r.update(unexpected_key=1), "unexpected_key"),
        (lambda r: r.update(private=[]), "private"),
        (lambda r: r.update(household_rules={"max_household_size": 0}), "max_household_size"),
        (lambda r: alloc(r).update(synthesis_split="guess"), "synthesis_split"),
        (lambda r: advanced(r, "synthesis").update(prior_strength=0), "prior_strength"),
        (lambda r: advanced(r, "synthesis").update(adaptive={"rounds": 4, "share": 1.0}), "adaptive.share"),
        (lambda r: (alloc(r).update(synthesis_split="public_simulation"), r.update(synthesizer="hgem")), "models the prior update"),
        (lambda r: advanced(r, "synthesis").update(prior_flips=["HISP_ORIGIN", "HISP_ORIGIN"]), "prior_flips names an attribute twice"),
        (lambda r: alloc(r)["levels"]["state_synthesis"].update(state=0.5, nation=0.5), "state_synthesis {state: 1.0}.*synthesis_split: fixed"),
        (lambda r: r.update(geography={"states": [50, 99]}), "states \\[99\\] are not in the PUMA list"),
        (lambda r: r.update(geography={"states": [50, 50]}), "names a state twice"),
        (lambda r: r.update(geography={"pumas": "puma_1990"}), "no shipped PUMA list 'puma_1990'"),
        (lambda r: r.update(geography={"pumas": "no_such_list.yaml"}), "cannot read the PUMA list"),
        (lambda r: r.update(weights={"file": "totals.csv"}), "weights.totals: Field required"),
    ],
)
def test_bad_configs_get_clear_errors(tmp_path, mutate, expected):
    with pytest.raises(ConfigError, match=expected) as e:
        load_config(write(tmp_path, mutate))
    assert str(tmp_path / "cfg.yaml") in str(e.value)


def test_unreadable_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def _no_count_of_counts(r):
    r["advanced"] = {"allocation": {"stages": {"state_synthesis": 0.5, "puma_synthesis": 0.5},
                       "levels": {"state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}}}}


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r.update(advanced={"count_of_counts": {"group_counts": "public"}}), "group_counts was removed.*invariants: \\[puma_household_counts\\]"),
        (_no_count_of_counts, "household counts are private"),
        (lambda r: r.update(invariants=["state_population"]), "invariants"),
        (lambda r: r.update(invariants=["puma_household_counts", "puma_household_counts"]), "at most once"),
    ],
)
def test_household_counts_need_a_measurement_or_a_declared_invariant(tmp_path, mutate, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(write(tmp_path, mutate))


def test_default_declares_no_invariant_and_plan_says_so():
    from flows.plan import render_plan

    cfg = load_config(DEFAULT)
    assert cfg.invariants == []
    text = render_plan(cfg)
    assert "invariants: none" in text and "holds for everything released" in text


def test_declared_invariant_is_stated_beside_the_budget(tmp_path):
    from flows.plan import render_plan

    def mutate(r):
        _no_count_of_counts(r)
        r["invariants"] = ["puma_household_counts"]

    text = render_plan(load_config(write(tmp_path, mutate)))
    assert "invariants: puma_household_counts" in text
    assert "except these invariants: puma_household_counts" in text


def test_group_counts_stage_is_a_source_of_household_counts(tmp_path):
    def mutate(r):
        r["advanced"] = {"allocation": {
            "stages": {"group_counts": 0.1, "state_synthesis": 0.45, "puma_synthesis": 0.45},
            "levels": {"group_counts": {"state": 0.5, "puma": 0.5}, "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}}}}

    assert load_config(write(tmp_path, mutate)).invariants == []


def test_locations_are_resolved_once_where_the_config_is_loaded(tmp_path, monkeypatch):
    """Dask workers may run in another directory with another environment: the loaded config
    carries absolute locations, so a task there reads the client's files."""
    import os

    from schemas.release_config import load_config

    cfg_dir = tmp_path / "client"
    cfg_dir.mkdir()
    (cfg_dir / "r.yaml").write_text(
        "name: r\nprivate: [{path: acs2018_1yr/csv_pvt.zip}]\npublic: [{path: acs2018_1yr/csv_pnh.zip}]\n"
        "data_root: data\noutput_dir: out\nwork_dir: w\nbudget: {rho: 0.1}\n"
        "synthesizer: public_baseline\n")
    monkeypatch.chdir(cfg_dir)
    cfg = load_config("r.yaml")
    monkeypatch.chdir(tmp_path)  # a worker elsewhere
    monkeypatch.setenv("DPRELEASE_DATA", "/somewhere/else")
    assert cfg.input_path(cfg.private[0]) == cfg_dir / "data" / "acs2018_1yr" / "csv_pvt.zip"
    assert cfg.run_dir() == cfg_dir / "w" / "r" and cfg.release_dir() == cfg_dir / "out" / "r"
    assert all(os.path.isabs(x) for x in (cfg.data_root, cfg.output_dir, cfg.work_dir))
    # the public weight totals are an input: relative to data_root; without the key, no weights
    assert cfg.weight_totals_path() is None
    assert cfg.model_copy(update={"weights": WeightsSpec(totals="pums_totals.csv")}).weight_totals_path() == cfg_dir / "data" / "pums_totals.csv"


def test_hgem_settings_default_to_the_engines_and_are_validated(tmp_path):
    from fractions import Fraction

    from engine.hgem.settings import HGEMSettings

    assert load_config(DEFAULT).advanced.hgem.settings() == HGEMSettings()  # one set of defaults, the engine's
    cfg = load_config(write(tmp_path, lambda r: r.update(advanced={"hgem": {"rounds": 2, "initial_share": 0.75, "hidden": [64]}})))
    s = cfg.advanced.hgem.settings()
    assert (s.rounds, s.initial_share, s.hidden, s.alpha) == (2, Fraction(3, 4), (64,), Fraction(1, 2))
    for bad, expected in (({"rounds": 0}, "initial_share = 1"), ({"alpha": 1.0}, "alpha"), ({"batch": 3}, "batch"),
                          ({"hidden": [0]}, "hidden")):
        with pytest.raises(ConfigError, match=expected):
            load_config(write(tmp_path, lambda r, bad=bad: r.update(advanced={"hgem": bad})))


def test_manifest_records_the_runs_settings(tmp_path):
    from engine.synthesis._settings import SynthesisSettings
    from flows.release import synthesizer_settings

    cfg = load_config(write(tmp_path, lambda r: advanced(r, "synthesis").update(prior_strength=0.3, adaptive={"rounds": 2, "share": 0.25})))
    settings = cfg.synthesis_settings(load_domain().domain(8))
    rec = synthesizer_settings(cfg, settings)
    assert "hgem" not in rec
    assert rec["prior_strength"] == 0.3 and rec["adaptive"]["rounds"] == 2 and rec["adaptive"]["share"] == "1/4"
    assert rec["strength_candidates"] == list(SynthesisSettings().strength_candidates)  # a default, recorded as resolved
    assert [f["attribute"] for f in rec["prior_flips"]] == [f.attribute for f in load_domain().flippable(load_domain().domain(8))]
    hg = cfg.model_copy(update={"synthesizer": "hgem"})
    rec = synthesizer_settings(hg, settings)
    assert rec["hgem"] == hg.advanced.hgem.settings().to_dict() and rec["hgem"]["initial_share"] == "4/5"
    assert synthesizer_settings(cfg.model_copy(update={"synthesizer": "public_baseline"}), settings) == {}


def test_synthesis_split_keeps_the_synthesis_sum_and_an_exact_plan(tmp_path):
    """``with_state_fraction`` divides the two synthesis shares' sum; the plan's shares stay exact
    decimals summing to 1, and the other stages keep theirs."""
    from fractions import Fraction

    from tasks.context import budget_plan

    cfg = load_config(DEFAULT)
    assert cfg.allocation.synthesis_split == "public_simulation"
    before = budget_plan(cfg)
    for f in (Fraction(1, 5), Fraction(7, 10), Fraction(9, 10)):
        split = cfg.with_allocation(cfg.allocation.with_state_fraction(f))
        plan = budget_plan(split)
        synth = before.stage_rho("state_synthesis") + before.stage_rho("puma_synthesis")
        assert plan.stage_rho("state_synthesis") == f * synth and plan.stage_rho("puma_synthesis") == (1 - f) * synth
        assert plan.total_rho == before.total_rho and plan.stage_rho("count_of_counts") == before.stage_rho("count_of_counts")


def test_a_templated_release_name_is_expanded_inside_a_run_only():
    from schemas.release_config import expand_release_name

    assert expand_release_name("{name}-{date}-{run}", "acs", "2027-10-01", "3fa9c2d1") == "acs-2027-10-01-3fa9c2d1"
    with pytest.raises(ConfigError, match=r"unknown field \{year\}"):
        expand_release_name("{name}-{year}", "acs", "2027-10-01", "x")
    cfg = DEFAULT
    assert load_config(cfg, name="{name}-{date}", run=("2027-10-01", "ab")).name == f"{load_config(cfg).name}-2027-10-01"
    with pytest.raises(ConfigError, match="is a template"):
        load_config(cfg, name="{name}-{date}")
    with pytest.raises(ConfigError, match="name must be"):
        load_config(cfg, name="{name}/{date}", run=("2027-10-01", "ab"))


def load_domain(name: str = "acs_pums"):
    from schemas.domain_spec import domain_spec_path, load_domain_spec

    return load_domain_spec(domain_spec_path(name))


def test_a_moved_or_removed_key_is_refused_with_one_line_naming_it(tmp_path):
    from schemas.release_config import MOVED, RETIRED_ADAPTIVE, RETIRED_SYNTHESIS

    def old(r):
        r["allocation"] = alloc(r)
        r["synthesis"] = {"sampling": "balanced", "prior_strength": 0.1}
        advanced(r, "synthesis").update(level_consistency="rake", adaptive={"select_first": 2})

    path = write(tmp_path, old)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).splitlines() == [
        f"{path}: allocation: moved to advanced.allocation",
        f"{path}: synthesis: moved to advanced.synthesis",
        f"{path}: synthesis.sampling: removed (settled: balanced sampling always runs)",
        f"{path}: advanced.synthesis.level_consistency: removed (settled: the PUMA posteriors are always raked to the state)",
        f"{path}: advanced.synthesis.adaptive.select_first: " + RETIRED_ADAPTIVE["select_first"],
    ]
    for key in RETIRED_SYNTHESIS:  # every retired key is caught, each on its own line
        p = write(tmp_path, lambda r, key=key: advanced(r, "synthesis").update({key: None}))
        with pytest.raises(ConfigError) as e:
            load_config(p)
        assert str(e.value) == f"{p}: advanced.synthesis.{key}: {RETIRED_SYNTHESIS[key]}"
    for key in MOVED:
        with pytest.raises(ConfigError, match=f": {key}: moved to advanced.{key}$"):
            load_config(write(tmp_path, lambda r, key=key: r.update({key: {}})))
    # the same check guards a config built without load_config
    with pytest.raises(ValueError, match="synthesis.sampling: removed"):
        ReleaseConfig.model_validate({**yaml.safe_load(DEFAULT.read_text()), "synthesis": {"sampling": "balanced"}})


def restated_defaults(raw, model=ReleaseConfig, synthesizer="prior_update", prefix="") -> list[str]:
    """The keys of ``raw`` (a config as written) whose value is the schema's default."""
    from pydantic import BaseModel

    out = []
    for key, value in raw.items():
        field, where = model.model_fields[key], f"{prefix}{key}"
        nested = next((t for t in (field.annotation, *getattr(field.annotation, "__args__", ()))
                       if isinstance(t, type) and issubclass(t, BaseModel)), None)
        default = None if field.is_required() else field.get_default(call_default_factory=True)
        if key == "allocation" and model.__name__ == "AdvancedSpec":
            default = DEFAULT_ALLOCATIONS[synthesizer]
        if default is not None and (value == default or (isinstance(default, BaseModel) and value == default.model_dump())):
            out.append(where)
        elif nested is not None and isinstance(value, dict):
            out += restated_defaults(value, nested, synthesizer, f"{where}.")
        elif nested is not None and isinstance(value, list):
            out += [k for i, v in enumerate(value) for k in restated_defaults(v, nested, synthesizer, f"{where}.{i}.")]
    return out


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_config_lists_only_what_differs_from_the_defaults(path):
    raw = yaml.safe_load(path.read_text())
    load_config(path)
    assert restated_defaults(raw, synthesizer=raw.get("synthesizer", "prior_update")) == []


def test_a_restated_default_is_found():
    """The negative control of the check above: each default written out is named."""
    raw = yaml.safe_load(DEFAULT.read_text())
    raw.update(privacy_unit="household", domain="acs_pums", household_rules={"max_household_size": 8, "oversize": "exclude"})
    raw["budget"]["delta"] = 1e-10
    raw["public"][0]["layout"] = "auto"
    raw["advanced"] = {"allocation": DEFAULT_ALLOCATIONS["prior_update"].model_dump(),
                       "synthesis": {"prior_strength": 0.2, "adaptive": {"rounds": 8, "share": 0.3}}}
    assert sorted(restated_defaults(raw)) == ["advanced.allocation", "advanced.synthesis.adaptive", "budget.delta", "domain",
                                              "household_rules.max_household_size", "privacy_unit", "public.0.layout"]


def test_one_allocation_default_per_synthesizer_and_an_override_says_so(tmp_path):
    """Without ``advanced.allocation`` a config runs its synthesizer's default; a config that
    splits the synthesis otherwise must write it (the Delaware config overrides, visibly)."""
    for synthesizer in DEFAULT_ALLOCATIONS:
        cfg = load_config(write(tmp_path, lambda r, s=synthesizer: r.update(synthesizer=s)))
        assert cfg.allocation == DEFAULT_ALLOCATIONS[synthesizer] and cfg.advanced.allocation is None
    de = yaml.safe_load((PROJECT_ROOT / "deploy" / "releases" / "de_2018_from_2013.yaml").read_text())
    assert de["advanced"]["allocation"]["synthesis_split"] == "fixed"
    # a given allocation without a split takes the synthesizer's: the prior update's simulation
    cfg = load_config(write(tmp_path, lambda r: alloc(r).pop("synthesis_split")))
    assert cfg.allocation.synthesis_split == "public_simulation"


def test_the_prior_flips_default_is_every_attribute_the_domain_can_relabel(tmp_path):
    from engine.synthesis._prior_mixture import Flip

    spec = load_domain()
    domain = spec.domain(8)
    cfg = load_config(DEFAULT)
    flips = cfg.synthesis_settings(domain).prior_flips
    assert flips == spec.flippable(domain)
    names = {f.attribute for f in flips}
    # every person attribute but the relationship (it marks the householder) and the age (household
    # attributes derive from any person's), each with its householder attribute
    assert names == {a.name for a in domain.person} - {"RELP_GROUP", "AGEP_BAND"}
    assert next(f for f in flips if f.attribute == "SEX").householder_attributes == ("HHLDR_SEX",)
    assert next(f for f in flips if f.attribute == "RAC1P").householder_attributes == ("HHLDR_RAC1P",)
    # an override names the attributes relabelled
    race = load_config(write(tmp_path, lambda r: advanced(r, "synthesis").update(prior_flips=["RAC1P"])))
    assert race.synthesis_settings(domain).prior_flips == (Flip("RAC1P", ("HHLDR_RAC1P",)),)
    # the negative control: a household attribute derived from SEX other than by the householder's value
    other = spec.model_copy(update={"household_attributes": {
        **spec.household_attributes, "R18": spec.household_attributes["R18"].model_copy(update={"attribute": "SEX"})}})
    assert "SEX" not in {f.attribute for f in other.flippable(other.domain(8))} and "SEX" in names
    # an override replaces the default; [] flips nothing
    one = load_config(write(tmp_path, lambda r: advanced(r, "synthesis").update(prior_flips=["HISP_ORIGIN"])))
    assert one.synthesis_settings(domain).prior_flips == (Flip("HISP_ORIGIN", ("HHLDR_HISP_ORIGIN",)),)
    none = load_config(write(tmp_path, lambda r: advanced(r, "synthesis").update(prior_flips=[])))
    assert none.synthesis_settings(domain).prior_flips == ()


def test_no_default_names_an_attribute_of_a_domain(tmp_path):
    """The config's defaults hold for any domain: none of them names a domain's attribute (the
    override does, which is the negative control)."""
    import json

    names = {n for d in ("acs_pums", "acs_pums_core", "acs_pums_aim")
             for n in (*load_domain(d).person_attributes, *load_domain(d).household_attributes)}
    text = json.dumps(load_config(DEFAULT).model_dump(mode="json"))
    assert not {n for n in names if f'"{n}"' in text}
    one = load_config(write(tmp_path, lambda r: advanced(r, "synthesis").update(prior_flips=["SEX"])))
    assert {n for n in names if f'"{n}"' in json.dumps(one.model_dump(mode="json"))} == {"SEX"}


def test_a_release_needs_about_ten_keys(capsys):
    """The schema's top level stays small: few required keys, the rest optional, the expert
    overrides in one ``advanced`` section (``python -m schemas.release_config --keys``)."""
    from schemas.release_config import _print_key_counts, key_counts

    counts = key_counts()
    keys, required = counts["(top level)"]
    assert required <= 10 and keys <= 20
    assert [s for s in counts if s != "(top level)" and "." in s and not s.startswith("advanced.")] == []
    _print_key_counts()
    out = capsys.readouterr().out
    assert "(top level)" in out and "advanced.synthesis" in out
