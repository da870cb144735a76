"""Adaptive measurement rounds (engine.synthesis._adaptive): the exact budget split, the candidates, their
answers, the selection's sensitivity on worst-case neighbours (the ε²/8 bounded-range charge),
and one node's rounds through a private session — charged, persisted, replayed."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from engine.data._geography import Geography
from engine.privacy._accountant import epsilon_for_exponential_rho, exponential_mechanism_rho
from engine.privacy._budget import BudgetPlan
from engine.privacy._ledger import PrivacyLedger
from engine.privacy._measurements import MeasurementStore
from engine.privacy._session import PrivateSession, l1_error_scores
from engine.queries._measurement import Measurement
from engine.queries._queries import NORM_SCALE, CandidateAnswers, Workload, answer, exact_answers
from engine.queries._support import Support
from engine.synthesis._adaptive import (
    SELECT_FIRST,
    AdaptiveRounds,
    candidate_workloads,
    expected_measurement_l1,
    initial_rho,
    measured_form,
    round_budget,
    selection_first,
)
from engine.synthesis._node import PICKS_PER_FIT, ROUND_FIT_TOL, synthesize_node
from engine.synthesis._state_release import session_measure, session_select
from tests.engine._support_testdata import random_data, small_domain
from tests.privacy.test_workload_sensitivity import DATA, DOMAIN, rederive
from tests.sensitivity_harness import neighbour_pairs


@pytest.mark.parametrize("rho,rounds,share", [(Fraction(1, 100), 8, Fraction(3, 10)), (Fraction(7, 3), 1, Fraction(1, 2)),
                                              (Fraction(1, 10**6), 16, Fraction(9, 10))])
def test_the_round_budget_is_exact_and_never_exceeds_the_node(rho, rounds, share):
    b = round_budget(rho, AdaptiveRounds(rounds, share))
    assert b.initial == rho * (1 - share)
    assert b.select == exponential_mechanism_rho(b.epsilon0) <= share * rho / rounds / 10  # ε₀²/8 ≤ the planned tenth
    assert b.measure == share * rho / rounds * Fraction(9, 10)
    assert b.total() <= rho and float(rho - b.total()) < 1e-12 * float(rho) + 1e-300
    assert epsilon_for_exponential_rho(b.select) == b.epsilon0  # the largest float ε₀ with ε₀²/8 ≤ ρ_select
    assert initial_rho(rho, AdaptiveRounds(rounds, share)) == b.initial  # what the given workloads get


def test_the_plan_is_validated():
    with pytest.raises(ValueError):
        AdaptiveRounds(4, 0)
    with pytest.raises(ValueError):
        AdaptiveRounds(0, Fraction(1, 2))
    with pytest.raises(ValueError):
        AdaptiveRounds(4, 1)
    with pytest.raises(ValueError, match="select_first"):
        AdaptiveRounds(4, Fraction(1, 2), select_first=0)
    assert round_budget(Fraction(1, 3), AdaptiveRounds()).initial == Fraction(1, 3)  # no rounds: all to the given workloads
    assert initial_rho(Fraction(1, 3), None) == initial_rho(Fraction(1, 3), AdaptiveRounds()) == Fraction(1, 3)
    assert initial_rho(Fraction(0), AdaptiveRounds(4, Fraction(1, 2))) == 0  # nothing to split


def test_candidates_against_brute_force():
    d = small_domain()
    attrs = [(a.name, "group", a.size) for a in d.group] + [(a.name, "person", a.size) for a in d.person]
    measured = Workload("person", (), (d.person[0].name, d.person[1].name), 2)
    got = candidate_workloads(d, first=2, max_cells=40, max_attributes=3, exclude=[measured])
    want = set()
    for k in (2, 3):
        for combo in itertools.combinations(attrs, k):
            if math.prod(c[2] for c in combo) > 40:
                continue
            g = tuple(c[0] for c in combo if c[1] == "group")
            p = tuple(c[0] for c in combo if c[1] == "person")
            want.add(Workload("person", g, p, 2) if p else Workload("group", g, ()))
    want.discard(measured)
    assert set(got) == want and len(got) == len(want)
    assert all(w.n_cells(d) <= 40 for w in got)


@pytest.mark.parametrize("first", [0, 2])
def test_candidate_answers_equal_the_engine_answers(first):
    d = small_domain()
    data = random_data(d, 200, seed=3)
    cands = candidate_workloads(d, first=first, max_cells=10**6)
    weights = np.random.default_rng(1).random(data.n_households)
    got = CandidateAnswers(data, cands).answers(cands, weights)
    want = np.concatenate([answer(data, w, weights) for w in cands])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mixed", [False, True])
def test_exact_answers_equal_the_engine_answers(mixed):
    """The private session's targets: every candidate's exact counts, through the pattern grouping
    or (a "contains" workload or two values of ``first`` among them) one by one."""
    d = small_domain()
    data = random_data(d, 150, seed=5)
    ws = candidate_workloads(d, first=2, max_cells=10**6)
    if mixed:
        ws = [*ws, Workload("group", ("TEN",), ("SEX",)), Workload("person", (), ("AGE",), 0)]
    got = exact_answers(data, ws)
    assert len(got) == len(ws)
    for w, y in zip(ws, got):
        np.testing.assert_array_equal(y, answer(data, w))


def test_candidate_answers_refuse_mixed_first_and_contains():
    d = small_domain()
    data = random_data(d, 20)
    with pytest.raises(ValueError):
        CandidateAnswers(data, [Workload("person", (), ("SEX",), 2), Workload("person", (), ("AGE",), 0)])
    with pytest.raises(ValueError):
        CandidateAnswers(data, [Workload("group", ("TEN",), ("SEX",))])


def em_log_probs(scores, sensitivity, epsilon):
    z = epsilon * scores / (2.0 * sensitivity)
    return z - np.logaddexp.reduce(z)


@pytest.mark.parametrize("unit", ["household", "person"])
@pytest.mark.parametrize("first", [0, SELECT_FIRST, 3])
def test_l1_selection_scores_are_bounded_range(unit, first):
    """The session's score ‖y_w(D) − m_w‖₁ − penalty_w moves by at most Δ = max_w L1(w) between
    neighbours (so the differences span ≤ 2Δ and the ε²/8 charge holds), on random and worst-case
    neighbours; the bound is attained to within a factor two."""
    rng = np.random.default_rng(5)
    cands = candidate_workloads(DOMAIN, first=first, max_cells=10**6)
    n_cells = [w.n_cells(DOMAIN) for w in cands]
    delta = max(w.sensitivity(DOMAIN, unit)[0] for w in cands)
    penalty = expected_measurement_l1(cands, DOMAIN, unit, Fraction(1, 10))

    def scores(data, model):
        return l1_error_scores(model, np.concatenate([answer(data, w) for w in cands]), n_cells) - penalty

    base = np.concatenate([answer(DATA, w) for w in cands])
    models = [base, base + rng.normal(0, 2, base.size), rng.random(base.size) * base.max()]
    widest = 0.0
    for a, b in neighbour_pairs(DATA, unit, trials=60, rng=rng, rederive=rederive):
        for model in models:
            diff = scores(b, model) - scores(a, model)
            assert np.abs(diff).max() <= delta + 1e-9
            ratio = em_log_probs(scores(b, model), delta, 0.9) - em_log_probs(scores(a, model), delta, 0.9)
            assert np.ptp(ratio) <= 0.9 + 1e-9  # ε-bounded range, directly
            widest = max(widest, float(np.abs(diff).max()))
    assert widest >= 0.5 * delta


PLAN = {"stages": {"s": 1}, "levels": {"s": {"nation": Fraction(1, 5), "state": Fraction(3, 10), "puma": Fraction(1, 2)}}}


def session(tmp_path, data, rho=2000):
    ledger = PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(rho, PLAN["stages"], PLAN["levels"]))
    return PrivateSession(data, "household", ledger, MeasurementStore(tmp_path / "m"), geography=Geography.of([(10, 1)]))


def test_the_session_selects_the_planted_error_charges_and_persists(tmp_path):
    data = random_data(small_domain(), 150, seed=8).with_geo(np.tile([10, 1], (150, 1)))
    s = session(tmp_path, data)
    ws = [Workload("group", ("TEN",)), Workload("person", (), ("SEX",)), Workload("group", ("NP",))]
    model = np.concatenate([answer(data, w) for w in ws])
    model[-4:] += 30.0  # the model is far off on the third workload only
    penalty = np.zeros(3)
    eps = 5.0  # Δ = 4 (person level, M = 4): still sharp at an L1 gap of 120
    assert s.select_worst_fit("s", "state", (10,), "round-0", ws, model, penalty, eps) == 2
    charge = s.ledger.get("s/ST=10/round-0/select")
    assert charge.mechanism == "exponential_mechanism" and float(charge.rho) == pytest.approx(eps**2 / 8)
    assert float(charge.sensitivity) == 4.0  # max L1 over the candidates, from the session's unit
    assert s.select_worst_fit("s", "state", (10,), "round-0", ws, np.zeros_like(model), penalty, eps) == 2  # persisted
    assert len(s.ledger.charges()) == 1


def test_the_penalty_keeps_a_noisy_workload_from_winning_on_noise(tmp_path):
    data = random_data(small_domain(), 150, seed=9).with_geo(np.tile([10, 1], (150, 1)))
    s = session(tmp_path, data)
    ws = [Workload("group", ("TEN",)), Workload("group", ("NP",))]
    model = np.concatenate([answer(data, w) for w in ws])
    model[:3] += 10.0  # L1 error 30 on TEN
    model[3:] += 9.0   # L1 error 36 on NP, but measuring NP would cost an expected L1 error of 40
    assert s.select_worst_fit("s", "state", (10,), "r", ws, model, np.array([0.0, 40.0]), 50.0) == 0


def test_a_node_with_adaptive_rounds_spends_its_budget_once_and_replays(tmp_path):
    d = small_domain()
    public = random_data(d, 300, seed=11)
    private = random_data(d, 400, seed=12, dependence=0.2).with_geo(np.tile([10, 1], (400, 1)))
    support = Support.from_data(public)
    rho = Fraction(3, 10) * 5  # the plan's state share of ρ = 5
    workloads = [Workload("group", ("TEN",)), Workload("person", (), ("AGE",), 2)]
    plan = AdaptiveRounds(3, Fraction(1, 2))

    def run(s):
        return synthesize_node(support, support.weights, workloads, rho, session_measure(s, "s", "state", (10,)), 400.0,
                               total_sd=5.0, adaptive=plan, select=session_select(s, "s", "state", (10,)), unit="household")

    first = run(session(tmp_path, private, rho=5))
    ledger = PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(5, PLAN["stages"], PLAN["levels"]))
    spent = ledger.spent()
    assert spent <= rho and float(rho - spent) < 1e-9 * float(rho)
    keys = [c.key for c in ledger.charges()]
    assert sum(k.endswith("/select") for k in keys) == 3 and len(keys) == 2 + 3 + 3
    assert len(first.diagnostics["adaptive"]) == 3 and not set(first.diagnostics["adaptive"]) & {w.id for w in workloads}
    again = run(session(tmp_path, private, rho=5))  # the same store and ledger: nothing new is drawn or charged
    np.testing.assert_array_equal(again.weights, first.weights)
    assert again.diagnostics["adaptive"] == first.diagnostics["adaptive"]
    assert PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(5, PLAN["stages"], PLAN["levels"])).spent() == spent


def test_candidates_exclude_measured_attribute_sets_in_any_form():
    """A measured workload removes the candidate of its level and attributes whatever persons it
    counts and however normalised; a "contains" workload does not remove the person-level one."""
    d = small_domain()
    p0, p1 = d.person[0].name, d.person[1].name
    measured = [Workload("person", (), (p0, p1), 0, True), Workload("group", ("TEN",), (p0,), 0, True)]
    got = candidate_workloads(d, first=2, max_cells=10**6, exclude=measured)
    assert Workload("person", (), (p0, p1), 2) not in got
    assert Workload("person", ("TEN",), (p0,), 2) in got
    assert len(got) == len(candidate_workloads(d, first=2, max_cells=10**6)) - 1


def test_the_measured_form_follows_the_nodes_workloads():
    """Normalised nodes score candidates on the first two persons' counts (or the plan's
    ``select_first``) and measure the chosen one normalised, counting the persons their normalised
    workloads count; plain nodes keep the candidate and their ``first``."""
    chosen = Workload("person", ("TEN",), ("SEX",), SELECT_FIRST)
    norm = [Workload("group", ("TEN",)), Workload("person", (), ("AGE",), 0, True)]
    assert selection_first(norm, 5) == 5 and selection_first([Workload("group", ("TEN",), ("AGE",), 0, True)], 4) == 4
    assert selection_first([Workload("person", (), ("AGE",), 2, True)], 5) == 2  # the measured workloads' own first wins
    assert measured_form(chosen, norm) == Workload("person", ("TEN",), ("SEX",), 0, True)
    assert measured_form(chosen, [Workload("person", (), ("AGE",), 3, True)]) == Workload("person", ("TEN",), ("SEX",), 3, True)
    assert selection_first([Workload("person", (), ("AGE",), 3, True)], SELECT_FIRST) == 3
    assert measured_form(Workload("group", ("TEN", "NP")), norm) == Workload("group", ("TEN", "NP"))  # a partition stays
    plain = [Workload("person", (), ("AGE",), 2)]
    assert selection_first(plain, 5) == 2 and measured_form(chosen, plain) == chosen  # their own first, not the plan's
    assert selection_first([Workload("person", (), ("AGE",))], SELECT_FIRST) == 0
    assert selection_first([Workload("group", ("TEN",), ("AGE",), 0, True)], SELECT_FIRST) == SELECT_FIRST


def normalised_node():
    """A state of 400 private households over 300 public ones, the plan's state share of ρ = 5 and
    two workloads, one normalised: (domain, private, support, ρ, workloads)."""
    d = small_domain()
    public = random_data(d, 300, seed=11)
    private = random_data(d, 400, seed=12, dependence=0.2).with_geo(np.tile([10, 1], (400, 1)))
    return d, private, Support.from_data(public), Fraction(3, 10) * 5, [Workload("group", ("TEN",)), Workload("person", (), ("AGE",), 0, True)]


def test_a_normalised_node_measures_its_rounds_normalised(tmp_path):
    """End to end through the private session: the rounds' workloads are normalised, charged at
    the normalised sensitivity, and the fit reproduces on a replay."""
    d, private, support, rho, workloads = normalised_node()

    def run(s):
        return synthesize_node(support, support.weights, workloads, rho, session_measure(s, "s", "state", (10,)), 400.0,
                               total_sd=5.0, adaptive=AdaptiveRounds(3, Fraction(1, 2)), select=session_select(s, "s", "state", (10,)),
                               unit="household")

    first = run(session(tmp_path, private, rho=5))
    chosen = [Workload.from_id(w) for w in first.diagnostics["adaptive"]]
    assert len(chosen) == 3 and all(w.normalised or w.is_partition() for w in chosen)
    stored = {m.workload_id: m for m in MeasurementStore(tmp_path / "m").all()}
    for w in chosen:  # σ of the normalised sensitivity (S households' worth) at the round's ρ
        m = stored[w.id]
        assert m.sensitivity == w.sensitivity(d, "household")[1] and (w.is_partition() or m.sensitivity == NORM_SCALE)
        assert m.scale == pytest.approx(w.sensitivity(d, "household")[1] / math.sqrt(2 * float(m.rho)), rel=1e-6)
    again = run(session(tmp_path, private, rho=5))
    np.testing.assert_array_equal(again.weights, first.weights)


ROUNDS = 5  # rounds enough for the first node's lists to outnumber the cache of last-used ones


@pytest.mark.parametrize("completion", [False, True])
def test_each_round_extends_the_previous_rounds_joint_patterns(tmp_path, monkeypatch, completion):
    """The rounds fit ``[*extra, *measured, *new]``, longer by the workloads picked since the last
    fit (:data:`PICKS_PER_FIT`, the last fit after the last pick): the households' joint patterns are
    grouped from nothing once per node, every later fit extends the cached list of the fit before
    by its new workloads, and the final fits use every measurement.
    With a ``completion`` (here the node's second workload) the rounds' fits leave it out — it is
    measured first all the same, at the same ρ, and the final fits take it in, their list extending
    ``[*extra, *measured]``, grouped once (on a worker, the same for every state). Both lists are
    kept for the next node on the support (``IncidenceCache.keep``): its rounds and final fits
    extend them without grouping them again, however many lists the node before it grouped."""
    from engine.queries._queries import IncidenceCache

    d, private, support, rho, workloads = normalised_node()
    size = Workload("group", ("NP",))
    extra = [Measurement(size, np.full(size.n_cells(d), 100.0), 5.0)]
    built = []  # (the list's workloads, how many of them a cached list already grouped)
    real = IncidenceCache._by_pattern

    def spy(self, ws):
        key = tuple(ws)
        built.append((key, next((k for k in range(len(key), 0, -1) if key[:k] in self._joint or key[:k] in self._kept), 0)))
        return real(self, ws)

    monkeypatch.setattr(IncidenceCache, "_by_pattern", spy)
    s = session(tmp_path, private, rho=5)
    res = synthesize_node(support, support.weights, workloads, rho, session_measure(s, "s", "state", (10,)), 400.0, total_sd=5.0, extra=extra,
                          adaptive=AdaptiveRounds(ROUNDS, Fraction(1, 2)), select=session_select(s, "s", "state", (10,)), unit="household",
                          completion=workloads[1:] if completion else ())
    chosen = [Workload.from_id(w) for w in res.diagnostics["adaptive"]]
    assert len(chosen) == ROUNDS and workloads[1] not in chosen
    base = [size, *workloads[:1]] if completion else [size, *workloads]
    n = len(base)
    fitted_after = [0, *range(PICKS_PER_FIT, ROUNDS, PICKS_PER_FIT), ROUNDS]  # the picks each of the rounds' fits takes in
    rounds_lists = [(tuple(base + chosen[:k]), 0 if j == 0 else n + fitted_after[j - 1]) for j, k in enumerate(fitted_after)]
    assert PICKS_PER_FIT < ROUNDS and built[:len(rounds_lists)] == rounds_lists
    final = (size, *workloads, *chosen)
    finals = built[len(rounds_lists):]
    if completion:  # [*extra, *measured] grouped on its own (the same for every state), which the final list extends
        assert finals[0][0] == (size, *workloads) and finals[1] == (final, 3)
        finals = finals[1:]
    assert finals and all(key == final for key, _ in finals)
    assert all(done == len(final) for _, done in finals[1:])  # later final fits find it
    stored = {m.workload_id for m in MeasurementStore(tmp_path / "m").all()}
    assert {w.id for w in workloads} <= stored
    # the next node on the support (another state of the run): its first list and, with the
    # completion, the final fits' prefix are found whole, after the first node's rounds and final
    # lists outnumbered the cache of last-used lists
    assert len({key for key, _ in built}) > IncidenceCache.JOINT_CACHE
    built.clear()
    s2 = session(tmp_path / "next", private, rho=5)
    synthesize_node(support, support.weights, workloads, rho, session_measure(s2, "s", "state", (11,)), 400.0, total_sd=5.0, extra=extra,
                    adaptive=AdaptiveRounds(ROUNDS, Fraction(1, 2)), select=session_select(s2, "s", "state", (11,)), unit="household",
                    completion=workloads[1:] if completion else ())
    assert built[0] == (tuple(base), n)
    if completion:
        assert ((size, *workloads), len(workloads) + 1) in built


@pytest.mark.parametrize("rounds", [4, 5])
def test_the_rounds_pick_on_one_fit_then_refit(tmp_path, monkeypatch, rounds):
    """The rounds pick :data:`PICKS_PER_FIT` candidates on one fit: a later pick is scored on the same
    model, the earlier pick's cells removed and the rest of it unchanged; the first pick after a fit
    sees a new model. The rounds fit once before the first pick and once after every
    :data:`PICKS_PER_FIT` picks and after the last; every pick is measured and charged as before."""
    import engine.synthesis._node as node

    d, private, support, rho, workloads = normalised_node()
    fits: list[int] = []  # measurements each of the rounds' fits takes in
    real_update = node.update_node

    def counted(*args, **kwargs):
        if kwargs.get("tol") == ROUND_FIT_TOL:
            fits.append(len(args[2]))
        return real_update(*args, **kwargs)

    monkeypatch.setattr(node, "update_node", counted)
    s = session(tmp_path, private, rho=5)
    real_select = session_select(s, "s", "state", (10,))
    calls = []

    def select(candidates, model, penalty, epsilon, tag):
        i = real_select(candidates, model, penalty, epsilon, tag)
        calls.append((list(candidates), np.array(model), i))
        return i

    res = synthesize_node(support, support.weights, workloads, rho, session_measure(s, "s", "state", (10,)), 400.0, total_sd=5.0,
                          adaptive=AdaptiveRounds(rounds, Fraction(1, 2)), select=select, unit="household")
    assert len(calls) == rounds == len(res.diagnostics["adaptive"])
    assert fits == [len(workloads) + k for k in [0, *range(PICKS_PER_FIT, rounds, PICKS_PER_FIT), rounds]]
    for r in range(1, rounds):
        before, model_before, i = calls[r - 1]
        candidates, model, _ = calls[r]
        assert candidates == before[:i] + before[i + 1:]
        cells = np.cumsum([0] + [w.n_cells(d) for w in before])
        rest = np.delete(model_before, slice(cells[i], cells[i + 1]))
        assert model.shape == rest.shape
        if r % PICKS_PER_FIT:
            np.testing.assert_array_equal(model, rest)
        else:
            assert not np.allclose(model, rest)  # refitted on the picks' measurements
    keys = [c.key for c in PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(5, PLAN["stages"], PLAN["levels"])).charges()]
    assert sum(k.endswith("/select") for k in keys) == rounds


@pytest.mark.parametrize("select_first", [SELECT_FIRST, 3])
def test_the_plans_select_first_picks_the_persons_the_candidates_count(select_first, tmp_path):
    """A normalised node's rounds score candidates that count the plan's ``select_first`` persons
    (their sensitivity, and so the selection's noise, with them); the chosen one is measured normalised."""
    d, private, support, rho, workloads = normalised_node()
    seen: list[set[int]] = []

    def select(candidates, model_counts, penalty, epsilon, tag):
        seen.append({w.first for w in candidates if w.level == "person"})
        return 0

    res = synthesize_node(support, support.weights, workloads, rho, session_measure(session(tmp_path, private, rho=5), "s", "state", (10,)), 400.0,
                          total_sd=5.0, adaptive=AdaptiveRounds(2, Fraction(1, 2), select_first=select_first), select=select,
                          unit="household")
    assert seen == [{select_first}, {select_first}]
    assert all(Workload.from_id(w).normalised or Workload.from_id(w).is_partition() for w in res.diagnostics["adaptive"])
