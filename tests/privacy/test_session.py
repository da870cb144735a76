"""PrivateSession: the private input reachable only through charged, persisted measurements."""

from __future__ import annotations

import dataclasses
import pickle
from fractions import Fraction

import numpy as np
import pytest

from engine.data._geography import Geography
from engine.privacy._budget import BudgetPlan
from engine.privacy._ledger import PrivacyLedger
from engine.privacy._measurements import MeasurementStore
from engine.privacy._session import InvariantNotDeclared, NoisySizes, PrivateSession, max_abs_error_scores, size_counts, size_histogram
from engine.queries._queries import Workload, answer
from tests.engine.test_hierarchical_data import random_data

PLAN = {"stages": {"s": 1}, "levels": {"s": {"nation": Fraction(1, 5), "state": Fraction(3, 10), "puma": Fraction(1, 2)}}}


GEOGRAPHY = Geography.of([(10, 100), (10, 200), (10, 300), (10, 400)])  # random_data's PUMAs and one it leaves empty


def session(tmp_path, data, unit="household", invariants=(), geography=GEOGRAPHY):
    ledger = PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(2000, PLAN["stages"], PLAN["levels"]))
    return PrivateSession(data, unit, ledger, MeasurementStore(tmp_path / "m"), invariants, geography=geography)


@pytest.fixture
def data():
    return random_data(np.random.default_rng(0), n=120, M=4)


def test_measurements_are_charged_persisted_and_reused(tmp_path, data):
    s = session(tmp_path, data)
    w = Workload("group", ("TEN",))
    m = s.measure_workload("s", "puma", (10, 100), w, Fraction(1, 10))
    assert m.key == "s/ST=10/PUMA=00100/group:TEN|" or m.key.startswith("s/ST=10/PUMA=00100/")
    assert m.sensitivity == w.sensitivity(data.domain, "household")[1]  # from the unit, not the caller
    charge = s.ledger.get(m.key)
    assert charge is not None and charge.rho == Fraction(1, 10) and charge.node == "ST=10/PUMA=00100"
    again = s.measure_workload("s", "puma", (10, 100), w, Fraction(1, 10))
    assert np.array_equal(again.noisy_answer, m.noisy_answer) and len(s.ledger.charges()) == 1
    # the noise is centred on the node's own answer (the node's households only)
    exact = answer(data.select(data.node_mask((10, 100))), w)
    assert np.abs(m.noisy_answer - exact).max() < 8 * m.scale


def test_household_and_size_counts(tmp_path, data):
    s = session(tmp_path, data)
    g = s.measure_household_count("s", "state", (10,), Fraction(1, 10))
    assert g.sensitivity == 1.0 and g.noisy_answer.shape == (1,)
    # household unit: the size histogram is measured (sensitivity 1, not √K), both forms returned
    sc = s.measure_sizes("s", "nation", (), 4, Fraction(1, 10))
    m = sc.measurement
    assert m.workload_id == "size_histogram" and m.noisy_answer.shape == (4,) and m.sensitivity == 1.0
    assert np.abs(sc.histogram - size_histogram(data.sizes, 4)).max() < 8 * m.scale
    assert np.allclose(sc.at_least, np.cumsum(sc.histogram[::-1])[::-1])
    assert np.abs(sc.at_least - size_counts(data.sizes, 4)).max() < 8 * np.sqrt(sc.count_variance)
    assert sc.count_variance == pytest.approx(4 * m.variance)
    assert sc.histogram_sd == pytest.approx(m.scale)
    # person unit: the histogram too (L1 2: a household grows by one; the at-least counts would
    # move K entries when a whole household leaves with its householder)
    lap = session(tmp_path / "p", data, unit="person").measure_sizes("s", "nation", (), 4, Fraction(1, 10), "laplace")
    m = lap.measurement
    assert m.workload_id == "size_histogram" and m.mechanism == "discrete_laplace" and m.sensitivity == 2.0
    assert m.variance == pytest.approx(2 * np.exp(-1 / m.scale) / (1 - np.exp(-1 / m.scale)) ** 2)
    assert np.allclose(lap.at_least, np.cumsum(m.noisy_answer[::-1])[::-1])
    assert lap.histogram_sd == pytest.approx(np.sqrt(m.variance)) and lap.count_variance == pytest.approx(4 * m.variance)
    # the at-least form as measured (NoisySizes.of): a histogram entry is a difference of two
    y = np.array([9.0, 6.0, 2.0, 1.0])
    got = NoisySizes.of(dataclasses.replace(m, noisy_answer=y), "at_least")
    assert np.allclose(got.histogram, [3.0, 4.0, 1.0, 1.0]) and got.count_variance == m.variance


def test_exact_counts_only_under_the_declared_invariant(tmp_path, data):
    with pytest.raises(InvariantNotDeclared, match="puma_household_counts"):
        session(tmp_path, data).invariant_household_counts()
    exact = session(tmp_path / "i", data, invariants=["puma_household_counts"]).invariant_household_counts()
    assert sum(exact.values()) == data.n_households and set(exact) == set(GEOGRAPHY.pumas) and exact[(10, 400)] == 0
    with pytest.raises(ValueError, match="unknown invariants"):
        session(tmp_path / "x", data, invariants=["state_population"])


def test_the_session_does_not_travel(tmp_path, data):
    s = session(tmp_path, data)
    with pytest.raises(TypeError, match="not serialisable"):
        pickle.dumps(s)
    assert "HierarchicalData" not in repr(s) and not hasattr(s, "data")
    assert s.nodes("puma") == [(10, 100), (10, 200), (10, 300), (10, 400)] and s.nodes("state") == [(10,)]


def test_the_nodes_are_declared_not_read_off_the_private_rows(tmp_path, data):
    """A neighbour without the only households of a PUMA has the same nodes, and that PUMA is
    measured like any other (noise around zero). Negative control: the nodes read off the rows
    (what the session did before) differ between the two neighbours."""
    only = np.flatnonzero(data.geo[:, 1] == 300)[:1]
    one_left = data.select(np.isin(np.arange(data.n_households), only) | (data.geo[:, 1] != 300))  # PUMA 300 keeps one household
    neighbour = data.select(data.geo[:, 1] != 300)  # ... which this neighbour removes
    a, b = session(tmp_path / "a", one_left), session(tmp_path / "b", neighbour)
    assert a.nodes("puma") == b.nodes("puma") == list(GEOGRAPHY.pumas)
    for s in (a, b):
        m = s.measure_household_count("s", "puma", (10, 300), Fraction(1, 10))
        empty = s.measure_sizes("s", "puma", (10, 400), 4, Fraction(1, 10))
        assert m.noisy_answer.shape == (1,) and empty.histogram.shape == (4,)
        assert np.abs(empty.histogram).max() < 8 * empty.histogram_sd  # no household: noise around zero
    def rows(d):
        return [tuple(int(x) for x in r) for r in np.unique(d.geo[:, :2], axis=0)]

    assert rows(one_left) != rows(neighbour)


def test_a_household_outside_the_declared_geography_is_refused(tmp_path, data):
    with pytest.raises(ValueError, match="outside the declared geography"):
        session(tmp_path, data, geography=Geography.of([(10, 100), (10, 200)]))


def test_selection_scores_inside_the_session_and_is_persisted(tmp_path, data):
    s = session(tmp_path, data)
    ws = [Workload("group", ("TEN",)), Workload("person", (), ("SEX",)), Workload("group", ("NP",))]
    mine = data.select(data.node_mask((10,)))
    norms = [float(mine.n_households), float(mine.n_persons), float(mine.n_households)]
    truth = [answer(mine, w).ravel() / n for w, n in zip(ws, norms)]
    model = np.concatenate([t.copy() for t in truth])
    model[-4:] += 0.5  # the model is far off on the third workload only
    eps = 50.0  # sharp: the worst workload wins with overwhelming probability
    idx = s.select_worst_workload("s", "state", (10,), "round-1", ws, norms, model, eps, 1.0 / 40)
    assert idx == 2
    charge = s.ledger.get("s/ST=10/round-1/select")
    assert charge.mechanism == "exponential_mechanism" and float(charge.rho) == pytest.approx(eps ** 2 / 8)
    # a rerun returns the persisted draw, whatever the model now says, and charges nothing
    assert s.select_worst_workload("s", "state", (10,), "round-1", ws, norms, np.zeros_like(model), eps, 1.0 / 40) == 2
    assert len(s.ledger.charges()) == 1


def test_max_abs_error_scores_against_brute_force():
    rng = np.random.default_rng(4)
    cells = [3, 1, 5, 2]
    t, m = rng.random(11), rng.random(11)
    starts = np.cumsum([0] + cells[:-1])
    brute = [np.abs(t[a : a + c] - m[a : a + c]).max() for a, c in zip(starts, cells)]
    assert np.allclose(max_abs_error_scores(m, t, cells), brute)
    with pytest.raises(ValueError):
        max_abs_error_scores(m[:-1], t[:-1], cells)


def test_a_node_measures_exactly_its_own_households(tmp_path, data):
    """The session's per-depth index (one sort) gives every declared node the households a mask
    would, for workloads and household sizes alike; a declared PUMA the input does not hold has
    none. Measured with negligible noise (σ far below one count), so the answers are the exact ones."""
    ledger = PrivacyLedger(tmp_path / "ledger.jsonl", BudgetPlan(10**6, PLAN["stages"], PLAN["levels"]))
    s = PrivateSession(data, "household", ledger, MeasurementStore(tmp_path / "m"), (), geography=GEOGRAPHY)
    w, rho = Workload("person", ("NP", "TEN"), ("SEX", "AGE")), Fraction(10**4)
    for level, nodes in (("nation", [()]), ("state", s.nodes("state")), ("puma", s.nodes("puma"))):
        for node in nodes:
            own = data.select(data.node_mask(node)) if node else data
            m = s.measure_workload("s", level, node, w, rho)
            assert m.scale < 0.1 and np.array_equal(np.rint(m.noisy_answer), np.rint(answer(own, w))), node
            sizes = s.measure_sizes("s", level, node, 4, rho)
            assert np.array_equal(np.rint(sizes.histogram), size_histogram(own.sizes, 4)), node
    empty = s.measure_sizes("s", "puma", (10, 400), 4, rho)
    assert not np.rint(empty.histogram).any()  # declared, holds no household
