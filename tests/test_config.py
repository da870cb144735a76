from pathlib import Path

import pytest
import yaml

from schemas.release_config import ConfigError, WeightsSpec, load_config
from tests.conftest import PROJECT_ROOT

DEFAULT = PROJECT_ROOT / "deploy" / "releases" / "acs2018_default.yaml"


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


def test_the_adaptive_selections_persons_reach_the_engines_plan(tmp_path):
    raw = yaml.safe_load(DEFAULT.read_text())
    raw["synthesis"]["adaptive"]["select_first"] = 5
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert load_config(path).synthesis.adaptive.plan("state").select_first == 5
    raw["synthesis"]["adaptive"]["select_first"] = 0
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match="select_first"):
        load_config(path)


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r["allocation"]["stages"].update(count_of_counts=0.5), "stage shares must sum to 1"),
        (lambda r: r["allocation"]["stages"].update(bogus=0.0), "unknown stage 'bogus'"),
        (lambda r: r["allocation"]["levels"]["state_synthesis"].update(county=0.0), "unknown level 'county'"),
        (lambda r: r["budget"].update(rho=0.5), "exactly one of budget.rho or budget.epsilon"),
        (lambda r: r["budget"].update(epsilon=-1), "budget.epsilon"),
        (lambda r: r.update(privacy_unit="family"), "privacy_unit"),
        (lambda r: r.update(name="a b/c"), "name must be"),
        (lambda r: r.update(synthesizer="magic"), "synthesizer"),
        (lambda r: r.update(unexpected_key=1), "unexpected_key"),
        (lambda r: r.update(private=[]), "private"),
        (lambda r: r["household_rules"].update(max_household_size=0), "max_household_size"),
        (lambda r: r["allocation"].update(synthesis_split="guess"), "synthesis_split"),
        (lambda r: r.setdefault("synthesis", {}).update(sampling="lottery"), "sampling"),
        (lambda r: r.setdefault("synthesis", {}).update(level_consistency="maybe"), "level_consistency"),
        (lambda r: r.setdefault("synthesis", {}).update(prior_strength_candidates=[0.1, 0.0]), "prior_strength_candidates"),
        (lambda r: r.setdefault("synthesis", {}).update(prior_strength_rule="guess"), "prior_strength_rule"),
        (lambda r: (r["allocation"].update(synthesis_split="public_simulation"), r.update(synthesizer="hgem")), "models the prior update"),
        (lambda r: (r["allocation"].update(synthesis_split="fixed"), r["allocation"]["stages"].update(state_synthesis=0, hgem=0.7),
                    r["allocation"]["levels"].update(hgem={"state": 1.0}), r.update(synthesizer="hgem"),
                    r.setdefault("synthesis", {}).update(person_first=2)), "H-GEM's mixture answers count every person"),
        (lambda r: r.setdefault("synthesis", {}).update(normalise="sometimes"), "normalise"),
        (lambda r: r.setdefault("synthesis", {}).update(puma_attributes=0), "puma_attributes"),
        (lambda r: r.setdefault("synthesis", {}).update(puma_attributes=6, puma_attributes_max=5), "puma_attributes_max \\(5\\) must be at least"),
        (lambda r: r.setdefault("synthesis", {}).update(puma_attributes_rule="always"), "puma_attributes_rule"),
        (lambda r: r.setdefault("synthesis", {}).update(prior_flips=["HISP_ORIGIN", "HISP_ORIGIN"]), "prior_flips names an attribute twice"),
        (lambda r: (r["allocation"].update(synthesis_split="public_simulation"),
                    r["allocation"]["levels"]["state_synthesis"].update(state=0.5, nation=0.5)), "state_synthesis {state: 1.0}"),
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
    r["allocation"] = {"stages": {"state_synthesis": 0.5, "puma_synthesis": 0.5},
                       "levels": {"state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}}}


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda r: r.update(count_of_counts={"group_counts": "public"}), "group_counts was removed.*invariants: \\[puma_household_counts\\]"),
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
        r["allocation"] = {"stages": {"group_counts": 0.1, "state_synthesis": 0.45, "puma_synthesis": 0.45},
                           "levels": {"group_counts": {"state": 0.5, "puma": 0.5}, "state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}}}

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
        "allocation: {stages: {group_counts: 1.0}, levels: {group_counts: {puma: 1.0}}}\nsynthesizer: public_baseline\n")
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

    assert load_config(DEFAULT).hgem.settings() == HGEMSettings()  # one set of defaults, the engine's
    cfg = load_config(write(tmp_path, lambda r: r.update(hgem={"rounds": 2, "initial_share": 0.75, "hidden": [64]})))
    s = cfg.hgem.settings()
    assert (s.rounds, s.initial_share, s.hidden, s.alpha) == (2, Fraction(3, 4), (64,), Fraction(1, 2))
    for bad, expected in (({"rounds": 0}, "initial_share = 1"), ({"alpha": 1.0}, "alpha"), ({"batch": 3}, "batch"),
                          ({"hidden": [0]}, "hidden")):
        with pytest.raises(ConfigError, match=expected):
            load_config(write(tmp_path, lambda r, bad=bad: r.update(hgem=bad)))


def test_manifest_records_the_hgem_settings(tmp_path):
    from flows.release import synthesizer_settings

    cfg = load_config(DEFAULT)
    assert "hgem" not in synthesizer_settings(cfg)
    hg = cfg.model_copy(update={"synthesizer": "hgem"})
    rec = synthesizer_settings(hg)
    assert rec["hgem"] == hg.hgem.settings().to_dict() and rec["hgem"]["initial_share"] == "4/5"
    assert rec["prior_strength"] == cfg.synthesis.prior_strength
    assert synthesizer_settings(cfg.model_copy(update={"synthesizer": "public_baseline"})) == {}


def test_synthesis_split_keeps_the_synthesis_sum_and_an_exact_plan(tmp_path):
    """``with_state_fraction`` divides the two synthesis shares' sum; the plan's shares stay exact
    decimals summing to 1, and the other stages keep theirs."""
    from fractions import Fraction

    from tasks.context import budget_plan

    cfg = load_config(write(tmp_path, lambda r: r["allocation"].update(synthesis_split="public_simulation")))
    before = budget_plan(cfg)
    for f in (Fraction(1, 5), Fraction(7, 10), Fraction(9, 10)):
        split = cfg.model_copy(update={"allocation": cfg.allocation.with_state_fraction(f)})
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
