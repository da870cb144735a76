"""tasks/synthesize.py: one state's PUMAs through the ledger and the measurement store (Vermont
private, New Hampshire public): every PUMA fitted, held to the state posterior and drawn; a rerun
after losing some PUMA files refits from the stored measurements and writes the same files.

No Prefect server: the tasks' ``.fn`` are called directly.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from engine.data._hierarchical_data import HierarchicalData
from tests.conftest import DATA_ROOT, encode_inputs

STATE = 50  # Vermont


def make_config(**synthesis):
    """``synthesis``: ``advanced.synthesis`` overrides."""
    from schemas.release_config import ReleaseConfig

    return ReleaseConfig.model_validate({
        "name": "puma-test",
        "data_root": str(DATA_ROOT),
        "private": [{"path": "acs2018_1yr/csv_pvt.zip"}],
        "public": [{"path": "acs2018_1yr/csv_pnh.zip"}],
        "budget": {"rho": 0.05},
        "advanced": {"allocation": {"stages": {"state_synthesis": 0.6, "puma_synthesis": 0.4}, "synthesis_split": "fixed",
                                    "levels": {"state_synthesis": {"state": 1.0}, "puma_synthesis": {"puma": 1.0}}},
                     "synthesis": synthesis},
        "invariants": ["puma_household_counts"],  # the test passes the exact PUMA counts as the jobs' counts
    })


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_root):
    return encode_inputs(make_config(), tmp_path_factory.mktemp("puma-inputs"))


def run_state(tmp, inputs, **synthesis):
    from engine.synthesis._workload_selection import select_workloads
    from tasks.context import RunContext
    from tasks.ingest import release_geography
    from tasks.run_context import prepare
    from tasks.synthesize import PumaJob, puma_batch_task, state_update_task

    cfg = make_config(**synthesis)
    paths = prepare(tmp / "work", tmp / "rel")
    ctx = RunContext(cfg, paths, inputs["private"], inputs["public"], release_geography(cfg, inputs["private"]))
    private = HierarchicalData.from_npz(inputs["private"])
    sel = select_workloads(HierarchicalData.from_npz(inputs["public"]), person_first=2)
    state_ids, puma_ids = [w.id for w in sel.state], [w.id for w in sel.puma]
    pumas, counts = np.unique(private.geo[:, 1], return_counts=True)
    nodes = [(STATE, int(p)) for p in pumas]
    posterior = state_update_task.fn(ctx, STATE, int(counts.sum()), state_ids, None, 0.0, nodes, puma_ids)
    # the state task made every PUMA's measurements (their sums are in the state's fit)
    assert len([c for c in ctx.ledger.charges() if c.stage == "puma_synthesis"]) == len(nodes) * len(puma_ids)
    # noisy counts (sd > 0): each PUMA's total is fitted jointly with its posterior
    jobs = [PumaJob(n, int(g), None, 15.0) for n, g in zip(nodes, counts)]
    files = puma_batch_task.fn(ctx, jobs, posterior, puma_ids, 7, None, state_ids)
    return ctx, jobs, posterior, puma_ids, state_ids, files


def digest(path) -> str:
    with np.load(path) as z:
        return hashlib.sha256(b"".join(np.ascontiguousarray(z[k]).tobytes() for k in sorted(z.files))).hexdigest()


@pytest.mark.flow
def test_state_pumas_are_fitted_held_to_the_state_and_redrawn_identically_on_resume(tmp_path, inputs):
    from engine.synthesis._level_consistency import totals_to_parent
    from tasks.synthesize import puma_batch_task

    ctx, jobs, posterior, puma_ids, state_ids, files = run_state(tmp_path, inputs)
    assert len(files) == len(jobs) >= 2
    state_meta = json.loads(open(posterior.replace(".npz", ".json")).read())
    sigmas = state_meta["sigmas"]
    assert set(state_ids) <= set(sigmas) and all(s > 0 for s in sigmas.values())
    assert state_meta["diagnostics"]["puma_sums"] == {"pumas": len(jobs), "workloads": puma_ids}
    assert state_meta["diagnostics"]["prior_mixture"]["attributes"] == ["SEX", "HISP_ORIGIN"]  # the default: every binary person attribute, weighed
    # the PUMA fits read the state task's measurements back: each PUMA workload charged once
    puma_keys = [c.key for c in ctx.ledger.charges() if c.stage == "puma_synthesis"]
    assert len(puma_keys) == len(set(puma_keys)) == len(jobs) * len(puma_ids)
    fitted, drawn_totals = [], []
    for job, f in zip(jobs, files):
        fitted.append(json.loads(open(f.replace(".npz", ".json")).read())["diagnostics"]["total"]["fitted"])
        drawn = HierarchicalData.from_npz(f)
        drawn_totals.append(drawn.n_households)
        assert np.all(drawn.geo == job.node)
    # the fitted totals' shares held to the state's count: their sum is the counts', the PUMAs' split the fits'
    # (each fit moves its total off its own noisy count, so the split is not the counts')
    assert drawn_totals == totals_to_parent(fitted, [job.n_households for job in jobs]).tolist()
    assert sum(drawn_totals) == sum(job.n_households for job in jobs) and drawn_totals != [job.n_households for job in jobs]
    before = {f: digest(f) for f in files}
    charges = len(ctx.ledger.charges())
    for f in files[:2]:  # lost in a crash
        import os

        os.remove(f)
    again = puma_batch_task.fn(ctx, jobs, posterior, puma_ids, 7, None, state_ids)
    assert again == files and {f: digest(f) for f in files} == before
    assert len(ctx.ledger.charges()) == charges  # nothing measured or charged again


@pytest.mark.flow
@pytest.mark.parametrize("attribute, relabel", [("HISP_ORIGIN", ("HHLDR_HISP_ORIGIN",)), ("RAC1P", ("HHLDR_RAC1P",))])
def test_a_public_prior_far_from_the_state_takes_the_relabelled_households_in_and_the_pumas_draw_from_them(tmp_path, inputs, attribute,
                                                                                                         relabel):
    """New Hampshire's households relabelled as the public data — their Hispanic origin flipped
    (about 98 % Hispanic against Vermont's 2 %), or their race's two commonest codes swapped (about
    94 % of persons in the second against Vermont's 1 %): the state task's mixture takes the
    relabelled copies in and records it, the state posterior and the PUMAs live on the widened
    support, and the drawn persons' shares follow Vermont's measurements, not the public prior.
    The attribute is named in ``advanced.synthesis.prior_flips`` (the support is then the public
    data and its one relabelling); the race swap's two codes are chosen from the state's
    measurements."""
    from engine.synthesis._prior_mixture import Flip, copied, flipped, named_flips

    public = HierarchicalData.from_npz(inputs["public"])
    j = public.domain.person_index(attribute)
    codes = np.bincount(public.person[:, j]).argsort()[::-1][:2]
    wrong = flipped(public, Flip(attribute, relabel, None if public.domain.person_attribute(attribute).size == 2 else tuple(sorted(codes))))
    wrong.to_npz(tmp_path / "public-wrong.npz")
    ctx, jobs, posterior, puma_ids, state_ids, files = run_state(tmp_path, {**inputs, "public": str(tmp_path / "public-wrong.npz")},
                                                                  prior_flips=[attribute])
    mixture = json.loads(open(posterior.replace(".npz", ".json")).read())["diagnostics"]["prior_mixture"]
    mine = next(i for i, a in enumerate(mixture["attributes"]) if a.split(":")[0] == attribute)
    if attribute == "RAC1P":  # the swap the state chose exchanges the two codes the public data had exchanged
        assert mixture["attributes"][mine] == f"{attribute}:{min(codes)}:{max(codes)}"
    assert mixture["widened"] and mixture["weights"][mine] == max(mixture["weights"]) > 0.5 and mixture["rss"][1] < mixture["rss"][0]
    used = [a for a, w in zip(mixture["attributes"], mixture["weights"]) if w > 0]
    with np.load(posterior) as z:  # the public households and the relabelled copies of each flip the mixture weighs in
        held = named_flips(z["flips"].tolist(), ctx.settings.prior_flips)
        assert [f.name.split("@")[0] for f in held] == used
        assert z["weights"].size == wrong.n_households + sum(copied(wrong, f).size for f in held)
        # a race swap leaves the households without either code as they are: they are not copied
        assert (z["weights"].size < 2 * wrong.n_households) == (attribute == "RAC1P")
    # the mixture read the state's initial measurements, which its fit read back: each charged once
    state_keys = [c.key for c in ctx.ledger.charges() if c.stage == "state_synthesis"]
    assert len(state_keys) == len(set(state_keys)) and set(state_ids) <= {k.split("/")[-1] for k in state_keys}
    drawn = HierarchicalData.concat([HierarchicalData.from_npz(f) for f in files])
    private = HierarchicalData.from_npz(inputs["private"])
    top = int(np.bincount(private.person[:, j]).argmax())
    share = {name: float(np.mean(d.person[:, j] == top)) for name, d in (("drawn", drawn), ("private", private), ("public", wrong))}
    assert share["public"] < 0.1 and abs(share["drawn"] - share["private"]) < 0.02, share


@pytest.mark.parametrize("flips, message", [
    (["NOT_AN_ATTRIBUTE"], "is not a person attribute"),
    (["RELP_GROUP"], "is the relationship"),
    (["AGEP_BAND"], "R18.*other than by its householder"),
])
def test_a_prior_flip_the_domain_cannot_take_is_refused_by_name(tmp_path, inputs, flips, message):
    from tasks.context import RunContext
    from tasks.run_context import prepare

    ctx = RunContext(make_config(prior_flips=flips), prepare(tmp_path / "work", tmp_path / "rel"), inputs["private"], inputs["public"])
    with pytest.raises(ValueError, match=message):
        ctx.settings  # noqa: B018 (built on first use, checked against the domain)


def test_the_default_relabels_every_attribute_it_can_and_a_named_one_alone(tmp_path, inputs):
    from engine.synthesis._prior_mixture import Flip
    from tasks.context import RunContext
    from tasks.run_context import prepare

    ctx = RunContext(make_config(), prepare(tmp_path / "work", tmp_path / "rel"), inputs["private"], inputs["public"])
    flips = {f.attribute: f for f in ctx.settings.prior_flips}
    assert flips["SEX"] == Flip("SEX", ("HHLDR_SEX",)) and flips["HISP_ORIGIN"] == Flip("HISP_ORIGIN", ("HHLDR_HISP_ORIGIN",))
    assert flips["RAC1P"] == Flip("RAC1P", ("HHLDR_RAC1P",)) and "CIT" in flips and "RELP_GROUP" not in flips
    # a multi-valued attribute named: its swap is chosen from the measurements
    race = RunContext(make_config(prior_flips=["RAC1P"]), ctx.paths, inputs["private"], inputs["public"])
    assert race.settings.prior_flips == (Flip("RAC1P", ("HHLDR_RAC1P",)),)
    assert RunContext(make_config(prior_flips=[]), ctx.paths, inputs["private"], inputs["public"]).settings.prior_flips == ()


def test_the_puma_attribute_cap_is_the_release_configs_and_reaches_the_recorded_selection(tmp_path):
    """``select_workload_task``'s cap (the settings' ``puma_attributes_max``) → ``select_workloads(puma_max_attributes)``:
    exactly that many one-way PUMA marginals here, a smaller cap's attributes among a larger cap's,
    recorded in the run's workload file."""
    from engine.queries._queries import Workload
    from engine.synthesis._settings import SynthesisSettings
    from tasks.synthesize import select_workload_task
    from tests.engine._support_testdata import random_data, small_domain

    npz = tmp_path / "public.npz"
    random_data(small_domain(M=4), 400, seed=21, dependence=0.8).to_npz(npz)
    got = {}
    for cap in (1, 2, 3):
        rec = select_workload_task.fn(str(npz), str(tmp_path / f"workload{cap}.json"), SynthesisSettings(puma_attributes=1, puma_attributes_max=cap),
                                      True, False)
        one_way = [w for w in rec["puma"] if len(Workload.from_id(w).attrs) == 1]
        assert len(one_way) == len(rec["explanation"]["puma_attributes"]) == cap
        assert rec["explanation"]["params"]["puma_max_attributes"] == cap
        assert json.loads((tmp_path / f"workload{cap}.json").read_text())["puma"] == rec["puma"]
        got[cap] = set(rec["explanation"]["puma_attributes"])
    assert got[1] < got[2] < got[3]


def test_the_prior_updates_workloads_complete_the_pairs_and_h_gems_do_not(tmp_path):
    """``select_workload_task``: the prior update's workloads (``engine.synthesis._state_release.choose_workloads``)
    are normalised and the state level gains the persons' missing two-way marginals, recorded in the
    run's workload file; H-GEM's are the selection's cliques as plain counts."""
    from engine.queries._queries import Workload
    from engine.synthesis._settings import SynthesisSettings
    from tasks.synthesize import select_workload_task
    from tests.engine._support_testdata import random_data, small_domain

    npz = tmp_path / "public.npz"
    random_data(small_domain(M=4), 400, seed=21, dependence=0.8).to_npz(npz)
    settings = SynthesisSettings(puma_attributes=1, puma_attributes_max=4)
    plain = select_workload_task.fn(str(npz), str(tmp_path / "w.json"), settings, False, True)
    full = select_workload_task.fn(str(npz), str(tmp_path / "w_pairs.json"), settings, True, True)
    added = full["completed"]
    assert added and set(added) <= set(full["state"]) and plain["completed"] == []
    assert all(Workload.from_id(i).level == "person" and len(Workload.from_id(i).attrs) == 2 for i in added)
    assert json.loads((tmp_path / "w_pairs.json").read_text())["state"] == full["state"]
    assert len(full["explanation"]["completed_pairs"]) == len(added) and plain["explanation"]["completed_pairs"] == []
    assert all(Workload.from_id(w).normalised for w in full["state"] if not Workload.from_id(w).is_partition())
    assert not any(Workload.from_id(w).normalised for w in plain["state"] + plain["puma"])


def test_the_puma_attribute_choice_follows_the_budget_is_kept_for_a_resume_and_leaves_the_sizes_out(tmp_path):
    """``choose_puma_attributes_task``: the engine's rule at the plan's PUMA ρ and the median DP PUMA
    count, a prefix of the ranking recorded in the work directory and read back by a resumed run;
    with the count-of-counts stage measuring the sizes, the size attribute is not ranked."""
    from engine.synthesis._puma_attributes import choose_puma_attributes
    from engine.synthesis._settings import SynthesisSettings
    from engine.synthesis._workload_selection import WorkloadSelection
    from tasks.context import RunContext
    from tasks.run_context import prepare
    from tasks.synthesize import choose_puma_attributes_task, select_workload_task
    from tests.engine._support_testdata import random_data, small_domain

    data = random_data(small_domain(M=4), 600, seed=21, dependence=0.8)
    npz = tmp_path / "public.npz"
    data.to_npz(npz)
    settings = SynthesisSettings(puma_attributes=1, puma_attributes_max=4)
    with_sizes = select_workload_task.fn(str(npz), str(tmp_path / "w_sizes.json"), settings, True, True)
    assert "NP" not in with_sizes["explanation"]["puma_attribute_ranking"]
    wide = SynthesisSettings(puma_attributes=1, puma_attributes_max=6)
    assert "NP" in select_workload_task.fn(str(npz), str(tmp_path / "w.json"), wide, True, False)["explanation"]["puma_attribute_ranking"]
    record = select_workload_task.fn(str(npz), str(tmp_path / "w4.json"), settings, True, True)
    ranked = WorkloadSelection.from_record(record).puma_ranked
    assert len(ranked) >= 3
    counts = [120, 150, 180]
    got = {}
    for rho in (1e-6, 10.0):
        cfg = make_config().model_copy(update={"budget": make_config().budget.model_copy(update={"rho": rho})})
        ctx = RunContext(cfg, prepare(tmp_path / f"work{rho}", tmp_path / f"rel{rho}"), "", str(npz))
        # the run's settings as a notebook hands them to the engine: bounds that this small domain's ranking spans
        ctx.__dict__["settings"] = settings
        out = choose_puma_attributes_task.fn(ctx, record, counts)
        want = choose_puma_attributes(data, ranked, sum(w not in set(ranked) for w in WorkloadSelection.from_record(record).puma), "household",
                                      float(ctx.allocation("puma_synthesis", "puma")), 150.0, minimum=1, maximum=4)
        assert json.loads(ctx.paths.puma_attributes_path.read_text()) == want.to_dict()
        assert out == WorkloadSelection.from_record(record).with_puma_attributes(want.count).to_record()
        got[rho] = want.count
        # a resumed run reads the stored choice back instead of recomputing it
        ctx.paths.puma_attributes_path.write_text(json.dumps({**want.to_dict(), "puma_attributes": 2}))
        assert len(choose_puma_attributes_task.fn(ctx, record, counts)["explanation"]["puma_attributes"]) == 2
    assert got[1e-6] == 1 and got[10.0] == len(ranked)
