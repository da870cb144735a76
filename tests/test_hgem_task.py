"""tasks/hgem.py: one state of H-GEM through the ledger and the measurement store (Vermont, tiny model).

No Prefect server: the task's ``.fn`` is called directly.
"""

from __future__ import annotations

import json
import os
from fractions import Fraction

import numpy as np
import pytest

from engine.data._hierarchical_data import HierarchicalData
from engine.privacy._ledger import BudgetExceededError
from tests.conftest import DATA_ROOT, encode_inputs

TINY = dict(rounds=3, batch_size=32, z_dim=8, hidden=[32], max_update_steps=20, pretrain_steps=20, kway_per_group_count=2)
N_SAMPLES = 500
STATE = 50  # Vermont


def make_config():
    from schemas.release_config import ReleaseConfig

    return ReleaseConfig.model_validate({
        "name": "hgem-test",
        "data_root": str(DATA_ROOT),
        "private": [{"path": "acs2018_1yr/csv_pvt.zip"}],
        "public": [{"path": "acs2018_1yr/csv_pnh.zip"}],
        "budget": {"rho": 1.0},
        "synthesizer": "hgem",  # with H-GEM's default allocation
        "advanced": {"hgem": TINY},
    })


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, data_root):
    return encode_inputs(make_config(), tmp_path_factory.mktemp("hgem-inputs"))


@pytest.fixture(scope="module")
def tiny():
    """The test config's (tiny) H-GEM settings."""
    return make_config().advanced.hgem.settings()


HOUSEHOLDS = 3000  # the state's household count as the flow passes it (a DP estimate there)


def context(cfg, paths, inputs):
    from tasks.context import RunContext
    from tasks.ingest import release_geography

    return RunContext(cfg, paths, inputs["private"], inputs["public"], release_geography(cfg, inputs["private"]))


def run_task(tiny, cfg, paths, inputs, n=N_SAMPLES, initial=None):
    from tasks.hgem import hgem_state_task

    return hgem_state_task.fn(context(cfg, paths, inputs), STATE, HOUSEHOLDS, n, None, initial)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, inputs, tiny):
    from tasks.run_context import prepare

    cfg = make_config()
    tmp = tmp_path_factory.mktemp("hgem-run")
    paths = prepare(tmp / "work", tmp / "rel")
    out = run_task(tiny, cfg, paths, inputs)
    return cfg, paths, out


def hgem_charges(cfg, paths):
    from tasks.context import RunContext

    return [c for c in RunContext(cfg, paths).ledger.charges() if c.stage == "hgem"]


def measurement_store(paths):
    from engine.privacy._measurements import MeasurementStore

    return MeasurementStore(paths.measurements_dir)


def test_output_is_valid_hierarchical_data(first_run, inputs, tiny):
    cfg, paths, out = first_run
    from engine.data._geography import node_key

    assert out == str(paths.node_path("hgem_support", node_key((STATE,))))
    synth = HierarchicalData.from_npz(out)
    private = HierarchicalData.from_npz(inputs["private"])
    assert synth.domain == private.domain
    assert synth.n_households == N_SAMPLES
    assert synth.n_persons >= N_SAMPLES
    assert np.all(synth.geo[:, 0] == STATE) and np.all(synth.geo[:, 1:] == 0)
    sizes = synth.sizes
    np_col = synth.group[:, synth.domain.group_index(synth.domain.size_attribute)]
    assert np.array_equal(np_col.astype(int) + 1, sizes)  # NP code m-1 agrees with the persons drawn
    meta = json.loads((paths.node_path("hgem_support", node_key((STATE,))).with_suffix(".json")).read_text())
    assert len(meta["rounds"]) == tiny.rounds and "score" not in meta["rounds"][0]


def test_household_structure_of_the_domain_spec(inputs):
    from engine.hgem.sampling import AnyPerson
    from tasks.hgem import household_structure

    domain = HierarchicalData.from_npz(inputs["public"]).domain
    s = household_structure(make_config(), domain)
    # RELP_GROUP's codes are its groups' numbers: 1 Householder, ..., 6 Group quarters resident
    assert (s.relationship, s.householder, s.group_quarters) == ("RELP_GROUP", "1", ("6",))
    assert not s.group_quarters_households  # household_rules.group_quarters: exclude (the default)
    assert dict(s.householder_attributes) == {"HHLDR_AGEP_BAND": "AGEP_BAND", "HHLDR_SEX": "SEX",
                                              "HHLDR_RAC1P": "RAC1P", "HHLDR_HISP_ORIGIN": "HISP_ORIGIN"}
    assert s.any_person == (AnyPerson("R18", "AGEP_BAND", ("0-17",)),)
    # only what the release keeps: without RELP_GROUP and SEX no relationship rule and no HHLDR_SEX
    from dataclasses import replace

    from schemas.domain_spec import load_domain_spec
    from schemas.household_structure import household_structure as structure_of

    kept = replace(domain, person=tuple(a for a in domain.person if a.name not in ("RELP_GROUP", "SEX")))
    s = structure_of(load_domain_spec(make_config().domain_path()), kept, group_quarters_households=True)
    assert s.relationship is None and s.group_quarters_households
    assert "HHLDR_SEX" not in dict(s.householder_attributes) and "HHLDR_AGEP_BAND" in dict(s.householder_attributes)


def test_sampled_households_are_structurally_consistent(first_run):
    """One householder per household, in slot 1; householder attributes equal slot 1's."""
    _, _, out = first_run
    synth = HierarchicalData.from_npz(out)
    dom = synth.domain
    rel = synth.person[:, dom.person_index("RELP_GROUP")]
    head = dom.person_attribute("RELP_GROUP").labels.index("Householder")
    first = synth.person_offsets[:-1]
    assert (rel[first] == head).all() and (rel == head).sum() == synth.n_households
    for g in ("AGEP_BAND", "SEX", "RAC1P", "HISP_ORIGIN"):
        assert np.array_equal(synth.group[:, dom.group_index(f"HHLDR_{g}")], synth.person[first, dom.person_index(g)])


def test_every_cost_is_in_the_ledger_within_the_allocation(first_run, inputs, tiny):
    cfg, paths, _ = first_run
    from tasks.context import RunContext

    ledger = RunContext(cfg, paths).ledger
    alloc = RunContext(cfg, paths).allocation("hgem", "state")
    charges = hgem_charges(cfg, paths)
    T = tiny.rounds
    assert len(charges) == 2 * T
    assert sorted(c.mechanism for c in charges) == ["discrete_gaussian"] * T + ["exponential_mechanism"] * T
    assert {(c.level, c.node) for c in charges} == {("state", "ST=50")}
    spent = ledger.spent("hgem", "state", "ST=50")
    assert spent == sum((c.rho for c in charges), Fraction(0))
    assert 0 < spent <= alloc
    assert float(spent) == pytest.approx(float(alloc), rel=1e-9)  # the whole allocation is used
    # every selection precedes its measurement in the ledger, and is persisted (index) in the store
    from engine.hgem.workloads import candidate_workloads

    keys = [c.key for c in charges]
    store = measurement_store(paths)
    candidates = candidate_workloads(HierarchicalData.from_npz(inputs["private"]).domain, tiny)
    for r in range(1, T + 1):
        sel = [k for k in keys if k.startswith(f"hgem/ST=50/round-{r}/")]
        assert sel[0] == f"hgem/ST=50/round-{r}/select" and len(sel) == 2
        chosen = store.get(sel[0])
        assert chosen.mechanism == "exponential_mechanism" and chosen.rho == charges[keys.index(sel[0])].rho
        assert sel[1] == f"hgem/ST=50/round-{r}/{candidates[int(chosen.noisy_answer[0])].id}"
    assert len([k for k in store.keys() if k.startswith("hgem/ST=50/")]) == 2 * T
    # the node is exhausted: the ledger refuses any further charge
    with pytest.raises(BudgetExceededError):
        ledger.charge(key="hgem/ST=50/extra", stage="hgem", level="state", node="ST=50",
                                       mechanism="discrete_gaussian", sensitivity=1.0, noise_scale=1.0, rho=Fraction(1, 10**6))


def test_resume_returns_the_output_without_new_charges(first_run, inputs, tiny):
    cfg, paths, out = first_run
    before = [c.to_json() for c in hgem_charges(cfg, paths)]
    meas_before = {m.key: m.sha256 for m in measurement_store(paths).all()}
    mtime = os.stat(out).st_mtime_ns
    assert run_task(tiny, cfg, paths, inputs) == out
    assert [c.to_json() for c in hgem_charges(cfg, paths)] == before
    assert {m.key: m.sha256 for m in measurement_store(paths).all()} == meas_before
    assert os.stat(out).st_mtime_ns == mtime


def test_rerun_after_lost_output_reuses_selections_and_measurements(tmp_path, inputs, tiny):
    from tasks.run_context import prepare

    cfg = make_config()
    paths = prepare(tmp_path / "work", tmp_path / "rel")
    out = run_task(tiny, cfg, paths, inputs, n=200)
    before = [c.to_json() for c in hgem_charges(cfg, paths)]
    meas_before = {m.key: m.sha256 for m in measurement_store(paths).all()}  # selections included
    os.remove(out)  # as if the run died after the last round, before saving the samples
    assert run_task(tiny, cfg, paths, inputs, n=200) == out
    assert HierarchicalData.from_npz(out).n_households == 200
    assert [c.to_json() for c in hgem_charges(cfg, paths)] == before
    assert {m.key: m.sha256 for m in measurement_store(paths).all()} == meas_before


def test_refused_when_the_node_budget_is_spent(tmp_path, inputs, tiny):
    from tasks.context import RunContext
    from tasks.run_context import prepare

    cfg = make_config()
    paths = prepare(tmp_path / "work", tmp_path / "rel")
    alloc = RunContext(cfg, paths).allocation("hgem", "state")
    RunContext(cfg, paths).ledger.charge(key="other/ST=50", stage="hgem", level="state", node="ST=50",
                                   mechanism="discrete_gaussian", sensitivity=1.0, noise_scale=1.0, rho=alloc / 2)
    with pytest.raises(BudgetExceededError):
        run_task(tiny, cfg, paths, inputs)
    assert [c.key for c in hgem_charges(cfg, paths)] == ["other/ST=50"]  # nothing spent by the task
    assert not list((paths.nodes_dir).glob("hgem*/*"))


def test_cluster_gpu_resources():
    from distributed import LocalCluster

    from tasks.hgem import cluster_has_gpu, gpu_resources

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as c:
        assert cluster_has_gpu(c.scheduler_address) is False
        assert gpu_resources(c.scheduler_address) == {}
    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0", resources={"GPU": 1}) as c:
        assert cluster_has_gpu(c.scheduler_address) is True
        assert gpu_resources(c.scheduler_address) == {"GPU": 1}
        # the flow's pattern: dask.annotate(resources=...) reaches distributed.Client.submit
        import dask
        from distributed import Client

        with Client(c.scheduler_address, set_as_default=False) as client:
            with dask.annotate(resources=gpu_resources(c.scheduler_address)):
                fut = client.submit(lambda x: x + 1, 1)
            assert fut.result() == 2


def test_uniform_prior_for_the_puma_update(first_run):
    from tasks.hgem import uniform_prior

    cfg, paths, out = first_run
    p = uniform_prior(paths, STATE, out)
    with np.load(p) as z:
        w = z["weights"]
    assert w.shape == (N_SAMPLES,) and np.allclose(w, 1 / N_SAMPLES)
    assert uniform_prior(paths, STATE, out) == p


INITIAL_IDS = ["group:NP,R18|", "person:HHLDR_SEX|SEX", "group:HHLDR_HISP_ORIGIN|HISP_ORIGIN"]


def test_initial_workloads_are_measured_first_and_paid_from_the_node(tmp_path, inputs, tiny):
    """The public-selected state workloads are measured once each at INITIAL_SHARE × ρ_node / n
    (keys hgem/<node>/initial/<id>, no selection), the rounds spend the rest, the whole allocation
    is used, and a rerun after a lost output charges nothing new."""
    from engine.data._geography import node_key
    from engine.hgem.privacy import state_budget
    from tasks.context import RunContext
    from tasks.run_context import prepare

    cfg = make_config()
    paths = prepare(tmp_path / "work", tmp_path / "rel")
    out = run_task(tiny, cfg, paths, inputs, 200, INITIAL_IDS)
    alloc = RunContext(cfg, paths).allocation("hgem", "state")
    charges = hgem_charges(cfg, paths)
    initial = [c for c in charges if "/initial/" in c.key]
    assert [c.key for c in initial] == [f"hgem/ST=50/initial/{i}" for i in INITIAL_IDS]
    assert all(c.mechanism == "discrete_gaussian" and c.rho == tiny.initial_share * alloc / 3 for c in initial)
    assert charges[:3] == initial  # measured before the first selection
    T = tiny.rounds
    assert len(charges) == 3 + 2 * T
    rb = state_budget(alloc, T, tiny.alpha, tiny.initial_share, n_initial=3)
    assert sum((c.rho for c in charges if "/round-" in c.key), Fraction(0)) == T * (rb.select + rb.measure)
    assert float(sum((c.rho for c in charges), Fraction(0))) == pytest.approx(float(alloc), rel=1e-9)
    meta = json.loads(paths.node_path("hgem_support", node_key((STATE,))).with_suffix(".json").read_text())
    assert meta["initial_workloads"] == INITIAL_IDS
    assert [r["round"] for r in meta["rounds"]] == list(range(T + 1))
    before = [c.to_json() for c in charges]
    meas = {m.key: m.sha256 for m in measurement_store(paths).all()}
    os.remove(out)
    run_task(tiny, cfg, paths, inputs, 200, INITIAL_IDS)
    assert [c.to_json() for c in hgem_charges(cfg, paths)] == before
    assert {m.key: m.sha256 for m in measurement_store(paths).all()} == meas
