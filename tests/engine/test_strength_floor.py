"""engine.synthesis._strength_floor: the simulated held-out errors against a direct recomputation (the same
noise, fits on the other states' households alone and marginals written out plainly), the floor's
rule (the smallest best), its reproducibility, one played state on its own and its bad inputs (the
floor's effect on the choice: tests/engine/test_prior_strength.py)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from engine.queries._measurement import Measurement
from engine.queries._metrics import k_way_workloads
from engine.queries._queries import Workload, answer
from engine.queries._support import Support
from engine.synthesis._map_update import map_fit
from engine.synthesis._strength_floor import SEED, play_state, played_states, simulate_strength_floor, strength_floor
from tests.engine._support_testdata import random_data, small_domain

DOMAIN = small_domain(M=4)
WORKLOADS = [Workload("group", ("TEN", "NP")), Workload("person", ("R18",), ("AGE",)), Workload("person", (), ("SEX", "RAC"), 0, True)]
CANDIDATES = (0.03, 0.1, 0.3)


def three_states(seed=0, n=300):
    """Three public states whose households differ (each drawn with its own dependence)."""
    parts = []
    for i, dep in enumerate((0.3, 0.6, 0.9)):
        d = random_data(DOMAIN, n, seed=seed + i, dependence=dep)
        parts.append(d.with_geo(np.stack([np.full(d.n_households, i + 1), np.full(d.n_households, 100)], axis=1)))
    return parts[0].concat(parts)


def test_the_held_out_errors_equal_a_direct_recomputation():
    public = three_states()
    rho = 0.05
    support = Support.from_data(public)
    got = simulate_strength_floor(support, WORKLOADS, "household", rho, CANDIDATES, held_out=10)
    held_out = k_way_workloads(DOMAIN, 3, "person", limit=10, rng=np.random.default_rng(SEED))
    assert len(held_out) == 10
    rho_w = Fraction(rho) / len(WORKLOADS)
    expected = []
    for s in (1, 2, 3):
        rng = np.random.default_rng(np.random.SeedSequence(SEED, spawn_key=(s,)))
        truth, prior = public.select(public.geo[:, 0] == s), public.select(public.geo[:, 0] != s)
        own = Support.from_data(prior)  # the other states' households alone (the simulation: all, the played state's at weight 0)
        measured = []
        for w in WORKLOADS:
            sd = w.sensitivity(DOMAIN, "household")[1] / np.sqrt(2 * float(rho_w))
            measured.append(Measurement(w, answer(truth, w) + rng.normal(0, sd, w.n_cells(DOMAIN)), sd, rho_w))
        errs = []
        for c in CANDIDATES:
            q = map_fit(own, own.weights, measured, truth.n_households, prior_strength=c * truth.n_households, tol=1e-10).weights
            l1 = []
            for w in held_out:
                a, b = answer(truth, w), answer(prior, w, q)
                l1.append(np.abs(a / a.sum() - b / b.sum()).sum())
            errs.append(np.mean(l1))
        expected.append((s, errs))
    assert [s for s, _ in got.table] == [1, 2, 3]
    for (s, e), (s2, e2) in zip(got.table, expected, strict=True):
        assert s == s2
        np.testing.assert_allclose(e, e2, rtol=1e-4)  # the simulation solves to FIT_TOL (from the previous candidate's dual)
        sharp = play_state(support, s, WORKLOADS, "household", rho, CANDIDATES, held_out=10, tol=1e-10)
        np.testing.assert_allclose(sharp, e2, rtol=1e-5)  # solved as tightly as the recomputation: the same errors
    bests = [CANDIDATES[int(np.argmin(e))] for _, e in expected]
    assert got.floor == min(bests)
    record = got.to_dict()
    assert record["floor"] == got.floor and [p["best"] for p in record["played"]] == bests
    # reproducible: a function of the public data, the workloads and rho; each played state on its own
    assert simulate_strength_floor(Support.from_data(public), WORKLOADS, "household", rho, CANDIDATES, held_out=10) == got
    assert play_state(Support.from_data(public), 2, WORKLOADS, "household", rho, CANDIDATES, held_out=10) == got.table[1][1]
    assert strength_floor(CANDIDATES[::-1], rho, list(got.table)) == got  # the flow's combination of the played states
    # more public states than max_played: a fixed sample of them plays, each against all the others
    two = simulate_strength_floor(support, WORKLOADS, "household", rho, CANDIDATES, held_out=10, max_played=2)
    assert len(two.table) == 2 and {s for s, _ in two.table} < {1, 2, 3}
    assert [s for s, _ in two.table] == played_states(public, 2).tolist()
    assert two == simulate_strength_floor(support, WORKLOADS, "household", rho, CANDIDATES, held_out=10, max_played=2)


def test_one_public_state_gives_no_floor_and_bad_inputs_are_refused():
    one = random_data(DOMAIN, 100, seed=1)
    one = one.with_geo(np.stack([np.ones(one.n_households, int), np.full(one.n_households, 100)], axis=1))
    assert simulate_strength_floor(Support.from_data(one), WORKLOADS, "household", 1.0, CANDIDATES).floor == 0.0
    assert played_states(one).size == 0 and strength_floor(CANDIDATES, 1.0, []).floor == 0.0
    public = Support.from_data(three_states())
    with pytest.raises(ValueError, match="positive"):
        simulate_strength_floor(public, WORKLOADS, "household", 1.0, (0.0, 0.1))
    with pytest.raises(ValueError, match="rho > 0"):
        simulate_strength_floor(public, WORKLOADS, "household", 0.0, CANDIDATES)
    with pytest.raises(ValueError, match="rho > 0"):
        simulate_strength_floor(public, [], "household", 1.0, CANDIDATES)
    with pytest.raises(ValueError, match="state 7"):
        play_state(public, 7, WORKLOADS, "household", 1.0, CANDIDATES)
