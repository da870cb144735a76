"""engine.synthesis._budget_split: the simulated expected error against a per-node brute force, the shrinkage
error against a Monte Carlo of the estimator it models, and the choice's behaviour."""

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from engine.data._hierarchical_data import HierarchicalData
from engine.queries._queries import Workload, answer
from engine.synthesis._budget_split import STATE_FRACTIONS, choose_state_fraction, expected_errors
from tests.engine.test_hierarchical_data import small_domain


def public_data(rng, n=900, identical_states=False):
    """Three states (two or three PUMAs each); unless ``identical_states``, the states' attribute
    distributions differ."""
    d = small_domain(3)
    st = rng.choice([1, 2, 3], n)
    puma = st * 100 + rng.integers(0, np.where(st == 3, 2, 3))
    tilt = np.zeros(n) if identical_states else (st - 2) * 0.25
    sizes = rng.integers(1, 4, n)
    group = np.stack([sizes - 1, (rng.random(n) < 0.5 + tilt).astype(int)], axis=1)
    person = (rng.random((sizes.sum(), 2)) < 0.4 + np.repeat(tilt, sizes)[:, None]).astype(int)
    return HierarchicalData.from_arrays(d, np.stack([st, puma], axis=1), group, person, np.r_[0, np.cumsum(sizes)])


WORKLOADS = [Workload("group", ("NP", "TEN"), ()), Workload("person", ("TEN",), ("SEX",)), Workload("person", (), ("SEX", "AGE"))]


def brute_force(data, workloads, unit, rho_state, rho_puma):
    """The module docstring's model, node by node and cell by cell."""
    def counts(sub, w):
        return answer(sub, w), (sub.n_households if w.level == "group" else sub.n_persons)

    s_err, p_err = [], []
    states = sorted(set(data.geo[:, 0].tolist()))
    for w in workloads:
        l2 = w.sensitivity(data.domain, unit)[1]
        var_s, var_p = l2**2 / (2 * rho_state / len(workloads)), l2**2 / (2 * rho_puma / len(workloads))
        for s in states:
            pumas = sorted(set(data.geo[data.geo[:, 0] == s, 1].tolist()))
            if len(pumas) < 2:
                continue
            c_s, d_s = counts(data.select(data.geo[:, 0] == s), w)
            c_o, d_o = counts(data.select(data.geo[:, 0] != s), w)
            puma_l1 = []
            v_s = np.array([(c_s[c] - c_o[c] / d_o * d_s) ** 2 * var_s / ((c_s[c] - c_o[c] / d_o * d_s) ** 2 + var_s) for c in range(len(c_s))])
            for p in pumas:
                c_p, d_p = counts(data.select((data.geo[:, 0] == s) & (data.geo[:, 1] == p)), w)
                total = 0.0
                for c in range(len(c_p)):
                    e2 = (c_p[c] - d_p / d_s * c_s[c]) ** 2 + (d_p / d_s) ** 2 * v_s[c]
                    total += math.sqrt(2 / math.pi) * math.sqrt(e2 * var_p / (e2 + var_p))
                puma_l1.append(total / d_p)
            v_rel = 1 / (1 / v_s + 1 / (len(pumas) * var_p))
            s_err.append(math.sqrt(2 / math.pi) * np.sqrt(v_rel).sum() / d_s)
            p_err.append(np.mean(puma_l1))
    return np.mean(s_err), np.mean(p_err)


@pytest.mark.parametrize("unit", ["household", "person"])
def test_expected_errors_equal_the_brute_force(unit):
    data = public_data(np.random.default_rng(0))
    got = expected_errors(data, WORKLOADS, unit, 0.02, 0.05)
    assert got == pytest.approx(brute_force(data, WORKLOADS, unit, 0.02, 0.05), rel=1e-9)


def test_shrinkage_error_is_the_estimators_mean_squared_error():
    """v = e²σ²/(e² + σ²) is the mean squared error of prior + e²/(e² + σ²)·(y − prior) with
    y = truth + N(0, σ²) and the prior off by e (Monte Carlo, 200,000 draws per case)."""
    from engine.synthesis._budget_split import _shrunk

    rng = np.random.default_rng(1)
    for e, sigma in ((0.0, 3.0), (2.0, 3.0), (10.0, 1.0), (1.0, 10.0)):
        y = rng.normal(0.0, sigma, 200_000)  # truth 0, prior e
        estimate = e + e**2 / (e**2 + sigma**2) * (y - e)
        assert np.mean(estimate**2) == pytest.approx(float(_shrunk(np.array([e**2]), sigma**2)[0]), rel=0.02, abs=1e-3)


def test_more_budget_at_a_level_lowers_its_error():
    data = public_data(np.random.default_rng(2))
    s1, p1 = expected_errors(data, WORKLOADS, "household", 0.01, 0.01)
    s2, p2 = expected_errors(data, WORKLOADS, "household", 0.1, 0.01)
    s3, p3 = expected_errors(data, WORKLOADS, "household", 0.01, 0.1)
    assert s2 < s1 and p2 < p1  # a better state posterior is a better PUMA prior
    assert p3 < p1 and s3 < s1  # the PUMAs' measurements inform their state's released answer


def test_choice_is_the_tables_minimum_and_identical_states_need_no_state_budget():
    data = public_data(np.random.default_rng(3))
    c = choose_state_fraction(data, WORKLOADS, "household", 0.05)
    assert [row[0] for row in c.table] == list(STATE_FRACTIONS)
    assert c.state_fraction == min(c.table, key=lambda r: r[1] + r[2])[0]
    assert c.to_dict()["state_fraction"] == str(c.state_fraction)
    # states drawn from one distribution: the prior is right up to the states' sampling error, so
    # the state level's measurements buy less than where the states differ
    same = choose_state_fraction(public_data(np.random.default_rng(4), n=20_000, identical_states=True), WORKLOADS, "household", 0.05)
    differ = choose_state_fraction(public_data(np.random.default_rng(4), n=20_000), WORKLOADS, "household", 0.05)
    assert same.state_fraction <= Fraction(3, 10) < differ.state_fraction


def test_needs_two_states():
    data = public_data(np.random.default_rng(5))
    with pytest.raises(ValueError, match="two public states"):
        expected_errors(data.select(data.geo[:, 0] == 1), WORKLOADS, "household", 0.1, 0.1)


def test_split_task_resolves_the_plan_and_is_reused_on_resume(tmp_path):
    """The run's task (``tasks.synthesize.choose_split_task``) picks the engine's choice at the
    plan's synthesis ρ, writes it to the work directory, and a resumed run reads it back instead of
    recomputing; the config resolved with it keeps the total ρ."""
    import yaml

    from schemas.release_config import load_config
    from tasks.context import RunContext
    from tasks.run_context import prepare
    from tasks.synthesize import choose_split_task
    from tests.conftest import PROJECT_ROOT

    raw = yaml.safe_load((PROJECT_ROOT / "deploy" / "releases" / "acs2018_default.yaml").read_text())
    raw["advanced"] = {"synthesis": {"adaptive": {"rounds": 0}}}  # the default allocation: the split simulated
    raw.update(work_dir=str(tmp_path / "work"), output_dir=str(tmp_path / "releases"))
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_config(tmp_path / "cfg.yaml")
    public = public_data(np.random.default_rng(6))
    public.to_npz(tmp_path / "public.npz")
    ctx = RunContext(cfg, prepare(cfg.run_dir(), cfg.release_dir()), public_npz=str(tmp_path / "public.npz"))
    ids = [w.id for w in WORKLOADS]
    got = choose_split_task.fn(ctx, ids)
    rho = float(ctx.plan.stage_rho("state_synthesis") + ctx.plan.stage_rho("puma_synthesis"))
    assert got == choose_state_fraction(public, WORKLOADS, "household", rho).to_dict()
    assert ctx.paths.synthesis_split_path.exists()
    ctx.paths.synthesis_split_path.write_text(json.dumps({**got, "state_fraction": "1/2"}))  # what a resume finds is what it uses
    assert choose_split_task.fn(ctx, ids)["state_fraction"] == "1/2"
    resolved = cfg.with_allocation(cfg.allocation.with_state_fraction(Fraction(got["state_fraction"])))
    assert RunContext(resolved, ctx.paths).plan.total_rho == ctx.plan.total_rho


def test_a_normalised_workload_weighs_like_counts_where_every_household_has_one_person():
    """With one person per household a normalised column is S·(the count column) and its
    sensitivity S, where counting the first person has sensitivity 1: the simulation, in
    households' units, gives the plain workload's errors."""
    rng = np.random.default_rng(3)
    data = public_data(rng)
    single = data.take(np.flatnonzero(data.sizes == 1))
    plain = [Workload("person", ("TEN",), ("SEX",)), Workload("person", (), ("SEX", "AGE"))]
    normalised = [Workload(w.level, w.group_attrs, w.person_attrs, 0, True) for w in plain]
    first = [Workload(w.level, w.group_attrs, w.person_attrs, 1) for w in plain]
    got = expected_errors(single, normalised, "household", 0.02, 0.05)
    assert got == pytest.approx(expected_errors(single, first, "household", 0.02, 0.05), rel=1e-12)
    # with larger households the normalised measurement is cheaper per household (sensitivity 1, not M)
    mixed_plain = expected_errors(data, plain, "household", 0.02, 0.05)
    mixed_norm = expected_errors(data, normalised, "household", 0.02, 0.05)
    assert mixed_norm[0] < mixed_plain[0] and mixed_norm[1] < mixed_plain[1]
