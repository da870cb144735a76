"""engine.hgem.state: one state's H-GEM (settings, exact budget split, oracles, resume accounting)
on the tiny synthetic domain, with recording in-memory oracles (CPU, tiny model)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from engine.hgem.privacy import score_sensitivity, state_budget
from engine.hgem.settings import HGEMSettings, HGEMSettingsError
from engine.hgem.state import (
    INITIAL_TAG,
    Normalisers,
    StateOracles,
    local_oracles,
    outstanding_rho,
    round_tag,
    run_state,
)
from engine.hgem.workloads import candidate_workloads
from engine.privacy._accountant import exponential_mechanism_rho
from engine.privacy._ledger import BudgetExceededError
from engine.queries._queries import Workload, answer

from .conftest import synthetic_data

TINY = HGEMSettings(rounds=2, batch_size=16, z_dim=4, hidden=(16,), max_update_steps=5, initial_update_steps=5,
                    pretrain_steps=5, kway=2, kway_per_group_count=2)


def test_state_budget_is_exact_and_is_the_gem_split():
    """No initial workloads: all of ρ over T rounds, each ρ/T split α to the selection (ε₀ = √(8 α ρ/T)
    up to the float ε₀ that fits) and the rest to the measurement."""
    for rho in (Fraction(1), Fraction(1, 3), Fraction(7, 1000)):
        for T in (1, 3, 8, 50):
            for alpha in (Fraction(1, 2), Fraction(1, 4)):
                rb = state_budget(rho, T, alpha, Fraction(4, 5))
                assert rb.total() <= rho and T * (rb.select + rb.measure) == rb.total() and rb.initial == 0
                assert rb.select == exponential_mechanism_rho(rb.epsilon0) <= alpha * rho / T
                assert rb.epsilon0 == pytest.approx(math.sqrt(8 * float(alpha * rho / T)), rel=1e-12)
                assert rb.measure == (1 - alpha) * rho / T


def test_state_budget_with_initial_workloads():
    rho = Fraction(3, 7)
    for share, T, n in ((Fraction(1, 2), 8, 17), (Fraction(3, 4), 3, 5), (Fraction(1), 0, 4)):
        rb = state_budget(rho, T, Fraction(1, 2), share, n_initial=n)
        assert rb.initial_each(n) == share * rho / n and rb.initial == share * rho
        assert rb.rounds == T and T * (rb.select + rb.measure) <= rho - share * rho
        assert rb.total() == n * rb.initial_each(n) + T * (rb.select + rb.measure)
        assert rb.total() <= rho and float(rb.total()) == pytest.approx(float(rho), rel=1e-9)
    assert state_budget(rho, 3, Fraction(1, 2), Fraction(1, 2), n_initial=0).initial == 0  # nothing to measure first
    with pytest.raises(HGEMSettingsError):
        state_budget(rho, 0, Fraction(1, 2), Fraction(1, 2), n_initial=4)  # budget left but no rounds
    with pytest.raises(HGEMSettingsError):
        state_budget(rho, 3, Fraction(1, 2), Fraction(1), n_initial=4)  # rounds without budget


def test_settings_are_checked_and_serialisable():
    d = HGEMSettings().to_dict()
    assert d["alpha"] == "1/2" and d["initial_share"] == "4/5" and d["hidden"] == [128, 128] and d["rounds"] == 4
    for bad in (dict(rounds=-1), dict(alpha=Fraction(1)), dict(initial_share=Fraction(3, 2)), dict(hidden=()),
                dict(batch_size=0), dict(lr=0.0), dict(rounds=0), dict(initial_share=Fraction(1)), dict(torch_threads=0)):
        with pytest.raises(HGEMSettingsError):
            HGEMSettings(**bad)
    assert HGEMSettings(rounds=0, initial_share=Fraction(1)).rounds == 0


class Recorder:
    """In-memory oracles (engine.hgem.state.local_oracles, argmax selection) that record every call."""

    def __init__(self, data, paid=frozenset(), remaining=None):
        base = local_oracles(data, "household", noise=self.noise, choose=lambda s, d, e: int(np.argmax(s)))
        self.calls: list[tuple] = []
        self.oracles = StateOracles(self.measure, self.select(base.select), paid, remaining)
        self._measure = base.measure

    @staticmethod
    def noise(counts, l2, rho):
        return np.asarray(counts), 0.5

    def measure(self, tag):
        def at(w, rho):
            self.calls.append(("measure", tag, w.id, rho))
            return self._measure(tag)(w, rho)
        return at

    def select(self, inner):
        def at(tag, ws, norms, model, eps, sens):
            self.calls.append(("select", tag, eps, sens))
            return inner(tag, ws, norms, model, eps, sens)
        return at


@pytest.fixture(scope="module")
def public(domain):
    return synthetic_data(domain, 800, seed=7)


def test_run_state_calls_the_oracles_in_order_at_the_split(domain, data, public):
    init = [Workload("group", ("TEN",)), Workload("person", (), ("AGE",))]
    rec = Recorder(data)
    rho = Fraction(1, 10)
    synth, fit = run_state(public, TINY, rho, data.n_households, rec.oracles, 300, unit="household", state=0,
                           initial_workloads=init, seed=3, device="cpu")
    rb = state_budget(rho, TINY.rounds, TINY.alpha, TINY.initial_share, 2)
    assert fit.budget == rb
    cands = candidate_workloads(domain, TINY)
    norm = Normalisers.of(data.n_households, public)
    delta = score_sensitivity(cands, domain, "household", norm.households, norm.persons)
    assert rec.calls[:2] == [("measure", INITIAL_TAG, w.id, rb.initial_each(2)) for w in init]
    rounds = rec.calls[2:]
    assert [c[:2] for c in rounds] == [(k, round_tag(r)) for r in (1, 2) for k in ("select", "measure")]
    assert all(c[2:] == (rb.epsilon0, delta) for c in rounds[::2]) and all(c[3] == rb.measure for c in rounds[1::2])
    # normalised units: the initial group measurement is the exact share of households per TEN code
    first = fit.result.measurements[0]
    np.testing.assert_allclose(first, answer(data, init[0]) / norm.households)
    assert synth.n_households == 300 and synth.domain == domain
    assert [h.round for h in fit.result.history] == [0, 1, 2]
    d = fit.diagnostics()
    assert d["initial_workloads"] == [w.id for w in init] and d["budget"]["initial"] == str(rb.initial)


def test_the_selection_picks_the_worst_workload_by_the_session_scores(domain, data):
    """local_oracles' scores: max over cells |answer / normaliser − model answer| (brute force)."""
    cands = candidate_workloads(domain, TINY)
    norms = [float(data.n_households) if w.level == "group" else float(data.n_persons) for w in cands]
    rng = np.random.default_rng(0)
    model = rng.random(sum(w.n_cells(domain) for w in cands))
    picked = []
    oracles = local_oracles(data, "household", choose=lambda s, d, e: picked.append(s) or int(np.argmax(s)))
    i = oracles.select("round-1", cands, norms, model, 1.0, 0.01)
    off = np.cumsum([0] + [w.n_cells(domain) for w in cands])
    brute = [np.abs(answer(data, w).ravel() / n - model[off[k]:off[k + 1]]).max() for k, (w, n) in enumerate(zip(cands, norms))]
    np.testing.assert_allclose(picked[0], brute)
    assert i == int(np.argmax(brute))


def test_outstanding_rho_counts_only_missing_charges():
    rb = state_budget(Fraction(1), 3, Fraction(1, 2), Fraction(1, 2), n_initial=2)
    ids = ["group:TEN|", "person:|AGE"]
    assert outstanding_rho(rb, ids, set()) == rb.total()
    paid = {(INITIAL_TAG, ids[0]), ("round-1", "select"), ("round-1", "group:TEN|"), ("round-2", "select")}
    assert outstanding_rho(rb, ids, paid) == rb.initial_each(2) + rb.measure + rb.select + rb.measure


def test_refused_before_anything_is_spent(domain, data, public):
    rec = Recorder(data, remaining=Fraction(1, 20))
    with pytest.raises(BudgetExceededError):
        run_state(public, TINY, Fraction(1, 10), data.n_households, rec.oracles, 10, unit="household", state=0,
                  initial_workloads=[Workload("group", ("TEN",))], device="cpu")
    assert rec.calls == []
