import json
from fractions import Fraction

import pytest

from engine.privacy._accountant import eps_delta_to_rho, rho_to_eps
from engine.privacy._budget import BudgetPlan

STAGES = {"count_of_counts": 0.2, "state_synthesis": 0.4, "puma_synthesis": 0.4}
LEVELS = {
    "count_of_counts": {"nation": 1 / 3, "state": 1 / 3, "puma": 1 / 3},
    "state_synthesis": {"nation": 0.5, "state": 0.5},
    "puma_synthesis": {"puma": 1.0},
}


def test_allocations_exact():
    p = BudgetPlan(Fraction(3, 2), STAGES, LEVELS)
    assert p.total_rho == Fraction(3, 2)
    assert p.allocation("count_of_counts", "state") == Fraction(3, 2) * Fraction(1, 5) * Fraction(1, 3) == Fraction(1, 10)
    assert p.allocation("state_synthesis", "nation") == Fraction(3, 10)
    assert p.allocation("puma_synthesis", "puma") == Fraction(3, 5)
    assert p.stage_rho("state_synthesis") == Fraction(3, 5)
    # a household is in one node per level: its total loss is the sum of all allocations
    assert sum(r["rho"] for r in p.rows()) == p.total_rho
    assert len(p.rows()) == 6


def test_float_thirds_normalised_exactly():
    p = BudgetPlan(1, STAGES, LEVELS)
    assert p.level_share("count_of_counts", "nation") == Fraction(1, 3)
    assert p.stage_share("count_of_counts") == Fraction(1, 5)


@pytest.mark.parametrize(
    "stages,levels",
    [
        ({"a": 0.5, "b": 0.4}, {"a": {"x": 1}, "b": {"x": 1}}),
        ({"a": "1/2", "b": "1/3"}, {"a": {"x": 1}, "b": {"x": 1}}),
        ({"a": 1}, {"a": {"x": 0.6, "y": 0.6}}),
        ({"a": 1}, {"a": {"x": Fraction(1, 3), "y": Fraction(1, 3), "z": Fraction(1, 3) + Fraction(1, 10**12)}}),
        ({"a": 1.2, "b": -0.2}, {"a": {"x": 1}, "b": {"x": 1}}),
        ({"a": 1}, {"a": {"x": 1}, "b": {"x": 1}}),
        ({"a": 0.5, "b": 0.5}, {"a": {"x": 1}}),
    ],
)
def test_bad_shares_rejected(stages, levels):
    with pytest.raises(ValueError):
        BudgetPlan(1, stages, levels)


def test_bad_total_and_unknown_names():
    with pytest.raises(ValueError):
        BudgetPlan(0, {"a": 1}, {"a": {"x": 1}})
    p = BudgetPlan(1, {"a": 1}, {"a": {"x": 1}})
    with pytest.raises(KeyError):
        p.allocation("b", "x")
    with pytest.raises(KeyError):
        p.allocation("a", "y")


def test_from_eps_delta():
    p = BudgetPlan.from_eps_delta(2.0, 1e-10, STAGES, LEVELS)
    assert isinstance(p.total_rho, Fraction)
    assert rho_to_eps(p.total_rho, 1e-10, "cks") <= 2.0
    assert float(p.total_rho) == pytest.approx(eps_delta_to_rho(2.0, 1e-10, "cks"), rel=1e-12)
    q = BudgetPlan.from_eps_delta(2.0, 1e-10, STAGES, LEVELS, method="simple")
    assert q.total_rho < p.total_rho
    assert p.epsilon("cks") == pytest.approx(2.0, rel=1e-9)


def test_to_dict_round_trip_and_table():
    p = BudgetPlan(Fraction(1, 7), STAGES, LEVELS, delta=1e-9)
    d = json.loads(json.dumps(p.to_dict()))
    assert BudgetPlan.from_dict(d) == p
    assert d["stages"]["count_of_counts"]["levels"]["puma"]["rho_per_node"] == str(Fraction(1, 7) / 15)
    t = p.render_table()
    for word in ["count_of_counts", "state_synthesis", "puma_synthesis", "nation", "1/105", "1e-09"]:
        assert word in t
    assert f"{p.epsilon('cks'):.4f}" in t and f"{p.epsilon('simple'):.4f}" in t
    assert p.epsilon("cks") < p.epsilon("simple")
