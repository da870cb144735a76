"""Adaptive-measurement training, EMA output, public pretraining and the sensitivities."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import numpy as np
import pytest
import torch

from engine.hgem.answers import AnswerPlan, exact_normalised_answers
from engine.hgem.config import NormalisedMeasurement, make_generator
from engine.hgem.pretrain import pretrain_public
from engine.hgem.privacy import (
    cell_sensitivity,
    measurement_l2_sensitivity,
    score_sensitivity,
)
from engine.hgem.settings import HGEMSettings
from engine.hgem.train import fit_hgem, score_select, train_hgem
from engine.hgem.workloads import kway_workloads
from engine.queries._queries import Workload

from .conftest import synthetic_data

CFG = dict(max_update_steps=60, lr=3e-3, batch_size=64, z_dim=16, hidden=(64, 64), update="gem")


def _errors(G, plan, tgt):
    with torch.no_grad():
        a = plan.answers(G())
    return float(plan.max_abs_error(a, tgt).max()), float((a - tgt).abs().mean())


def test_noiseless_training_reduces_workload_error(domain, data):
    ws = kway_workloads(domain, 3)
    true = exact_normalised_answers(data, ws)
    cfg = HGEMSettings(rounds=12, **CFG)
    G = make_generator(domain, cfg, 0, "cpu")
    plan = AnswerPlan(domain, ws, device="cpu")
    tgt = plan.concat_targets(true)
    before = _errors(G, plan, tgt)
    calls = {"select": [], "measure": []}

    def select(scores, sens):
        assert scores.shape == (len(ws),) and sens == pytest.approx(1 / 3000)
        calls["select"].append(int(np.argmax(scores)))
        return calls["select"][-1]

    def measure(w):
        calls["measure"].append(w)
        return true[ws.index(w)]

    res = train_hgem(domain, ws, score_select(true, select, 1 / 3000), measure, cfg, prior_households=0.0, generator=G)
    after = _errors(res.generator, plan, tgt)
    assert after[0] < 0.4 * before[0] and after[1] < 0.4 * before[1]
    assert [ws[i] for i in calls["select"]] == calls["measure"] == res.measured
    assert len(res.history) == 12 and all(r.steps <= cfg.max_update_steps for r in res.history)


def test_ema_output_is_the_ema_of_second_half_weights(domain, data):
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    cfg = HGEMSettings(rounds=6, ema_beta=0.7, **{**CFG, "max_update_steps": 5})
    snaps = []
    res = train_hgem(
        domain, ws, score_select(true, lambda s, e: int(np.argmax(s)), 1e-3), lambda w: true[ws.index(w)], cfg,
        prior_households=0.0, device="cpu", callback=lambda rec, G: snaps.append({k: v.detach().clone() for k, v in G.named_parameters()}),
    )
    ema = None
    for snap in snaps[3:]:  # rounds 4..6 (second half of T = 6)
        ema = snap if ema is None else {k: 0.7 * ema[k] + 0.3 * snap[k] for k in snap}
    out = dict(res.generator.named_parameters())
    last = dict(res.last_generator.named_parameters())
    for k in ema:
        torch.testing.assert_close(out[k], ema[k])
    assert any(not torch.allclose(out[k], last[k]) for k in out)
    torch.testing.assert_close(res.generator.z, res.last_generator.z)


def test_measure_length_is_checked(domain, data):
    ws = [Workload("group", ("TEN",))]
    with pytest.raises(ValueError):
        train_hgem(domain, ws, score_select(exact_normalised_answers(data, ws), lambda s, e: 0, 1e-3), lambda w: np.zeros(2),
                   HGEMSettings(rounds=1, **CFG), prior_households=0.0, device="cpu")


def test_public_pretraining_fits_public_answers(domain):
    public = synthetic_data(domain, 2000, seed=7)
    ws = kway_workloads(domain, 2)
    cfg = HGEMSettings(rounds=1, **CFG)
    G = make_generator(domain, cfg, 0, "cpu")
    plan = AnswerPlan(domain, ws, device="cpu")
    tgt = plan.concat_targets(exact_normalised_answers(public, ws))
    before = _errors(G, plan, tgt)
    hist = pretrain_public(G, public, ws, steps=150, lr=3e-3)
    after = _errors(G, plan, tgt)
    assert hist[-1] < 0.3 * hist[0]
    assert after[1] < 0.3 * before[1]


def test_fit_hgem_with_public_start_beats_public_only(domain, data):
    public = synthetic_data(domain, 2000, seed=7)
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    plan = AnswerPlan(domain, ws, device="cpu")
    tgt = plan.concat_targets(true)
    cfg = HGEMSettings(rounds=8, **CFG)
    pub_only = make_generator(domain, cfg, 0, "cpu")
    pretrain_public(pub_only, public, ws, steps=150, lr=3e-3)
    res = fit_hgem(data, ws, lambda s, e: int(np.argmax(s)), lambda w: true[ws.index(w)], 1e-3, replace(cfg, pretrain_steps=150),
                   prior_households=0.0, public=public, device="cpu")
    assert _errors(res.generator, plan, tgt)[1] < _errors(pub_only, plan, tgt)[1]


def test_sensitivities(domain):
    M = domain.max_size
    g0, g1, p = Workload("group", ("TEN",)), Workload("group", ("TEN",), ("AGE",)), Workload("person", (), ("AGE",))
    assert cell_sensitivity(g0, domain, "household") == 1.0
    assert cell_sensitivity(g1, domain, "household") == 1.0
    assert cell_sensitivity(g0, domain, "person") == 1.0
    assert cell_sensitivity(p, domain, "household") == M
    assert score_sensitivity([g0, p], domain, "household", 100, 250) == pytest.approx(max(1 / 100, M / 250))
    assert measurement_l2_sensitivity(g1, domain, "household", 100, 250) == pytest.approx(math.sqrt(M) / 100)


def test_cell_sensitivity_bound_holds_on_neighbours(domain, data):
    """Removing any one household never changes a count cell by more than the L∞ bound."""
    from engine.queries._queries import answer

    rng = np.random.default_rng(0)
    ws = kway_workloads(domain, 2)
    big = np.flatnonzero(data.sizes == domain.max_size)[:20]
    for h in np.concatenate([big, rng.choice(data.n_households, 10, replace=False)]):
        nb = data.select(np.arange(data.n_households) != h)
        for w in ws:
            assert np.abs(answer(data, w) - answer(nb, w)).max() <= cell_sensitivity(w, domain, "household")


def test_map_update_with_public_prior_improves_on_public_start(domain, data):
    """update="map": warm start from the public fit, weighted likelihood of all measurements plus
    the relative entropy to the public fit; with exact measurements it must not lose to its start."""
    public = synthetic_data(domain, 2000, seed=7)
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    plan = AnswerPlan(domain, ws, device="cpu")
    tgt = plan.concat_targets(true)
    cfg = HGEMSettings(rounds=6, **{**CFG, "update": "map"})
    G = make_generator(domain, cfg, 0, "cpu")
    hist = pretrain_public(G, public, ws, steps=400)
    assert len(hist) <= 400
    start = _errors(G, plan, tgt)
    res = train_hgem(domain, ws, score_select(true, lambda s, e: int(np.argmax(s)), 1e-3), lambda w: true[ws.index(w)], cfg,
                     prior_households=100.0, generator=G, measurement_sigma=lambda w: 1e-3)
    after = _errors(res.generator, plan, tgt)
    assert after[0] < start[0] and after[1] < start[1]
    # output="last" for the MAP rule: the returned generator is the final iterate
    for (_, a), (_, b) in zip(res.generator.named_parameters(), res.last_generator.named_parameters()):
        torch.testing.assert_close(a, b)


def test_map_prior_is_on_the_distribution_so_unmeasured_workloads_follow(domain, data):
    """The prior is a relative entropy to the public fit, not a hold on each answer: measuring only
    the 1-way TEN marginal (exactly) must also move the never-measured TEN × BLD and
    TEN-by-person workloads towards the truth when the public data has the wrong TEN mix."""
    ten = domain.group_index("TEN")
    pub_all = synthetic_data(domain, 4000, seed=7)
    keep = (pub_all.group[:, ten] != 0) | (np.arange(pub_all.n_households) % 4 == 0)  # TEN = 0 under-represented
    public = pub_all.select(keep)
    measured = Workload("group", ("TEN",), ())
    unmeasured = [Workload("group", ("TEN", "BLD"), ()), Workload("person", ("TEN",), ("AGE",))]
    ws = [measured] + unmeasured
    true = exact_normalised_answers(data, ws)
    cfg = HGEMSettings(rounds=3, **{**CFG, "update": "map"})
    G = make_generator(domain, cfg, 0, "cpu")
    pretrain_public(G, public, ws, steps=600)
    plan = AnswerPlan(domain, unmeasured, device="cpu")
    tgt = plan.concat_targets(true[1:])
    start = _errors(G, plan, tgt)
    res = train_hgem(domain, ws, score_select(true, lambda s, e: 0, 1e-3), lambda w: true[ws.index(w)], cfg,
                     prior_households=300.0, generator=G, measurement_sigma=lambda w: 2e-3)
    assert res.measured == [measured] * 3
    after = _errors(res.generator, plan, tgt)
    assert after[1] < 0.2 * start[1] and after[0] < 0.3 * start[0]


def _no_rounds(*_):
    raise AssertionError("rounds = 0: nothing may be selected or measured")


def test_initial_measurements_alone_fit_their_workloads(domain, data):
    """rounds = 0: round 0 updates on the initial measurements only (no selection, no measure
    call); the initial workloads' error drops from the public start, and so does the error of the
    correlated candidates that were never measured (the prior acts on the distribution)."""
    public = synthetic_data(domain, 2000, seed=7)
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    init_ws = [Workload("group", ("TEN",), ()), Workload("person", (), ("AGE",)), Workload("group", ("TEN",), ("AGE",))]
    init_true = exact_normalised_answers(data, init_ws)
    cfg = HGEMSettings(rounds=0, initial_share=Fraction(1), **{**CFG, "update": "map", "initial_update_steps": 300})
    G = make_generator(domain, cfg, 0, "cpu")
    pretrain_public(G, public, ws, steps=300)
    plan_i = AnswerPlan(domain, init_ws, device="cpu")
    tgt_i = plan_i.concat_targets(init_true)
    start = _errors(G, plan_i, tgt_i)
    initial = [NormalisedMeasurement(w, a, 1e-3) for w, a in zip(init_ws, init_true)]
    res = train_hgem(domain, ws, score_select(true, _no_rounds, 1e-3), _no_rounds, cfg, prior_households=100.0, generator=G,
                     initial=initial)
    assert res.measured == init_ws and len(res.measurements) == 3
    assert [r.round for r in res.history] == [0] and 0 < res.history[0].steps <= 300
    after = _errors(res.generator, plan_i, tgt_i)
    assert after[1] < 0.3 * start[1] and after[0] < 0.5 * start[0]


def test_first_selection_sees_the_initial_update(domain, data):
    """The first round's scores are taken after round 0: a workload measured exactly beforehand
    scores far lower than on the public start, and the rounds then add to the initial list."""
    public = synthetic_data(domain, 2000, seed=7)
    ws = kway_workloads(domain, 2)
    true = exact_normalised_answers(data, ws)
    k = next(i for i, w in enumerate(ws) if w.level == "group")
    cfg = HGEMSettings(rounds=2, **{**CFG, "update": "map"})
    G = make_generator(domain, cfg, 0, "cpu")
    pretrain_public(G, public, ws, steps=300)
    plan = AnswerPlan(domain, ws, device="cpu")
    with torch.no_grad():
        start_scores = plan.max_abs_error(plan.answers(G()), plan.concat_targets(true)).numpy()
    seen = []

    def select(scores, sens):
        seen.append(np.asarray(scores).copy())
        return int(np.argmax(scores))

    res = train_hgem(domain, ws, score_select(true, select, 1e-3), lambda w: true[ws.index(w)], cfg,
                     prior_households=100.0, generator=G, measurement_sigma=lambda w: 1e-3, initial=[NormalisedMeasurement(ws[k], true[k], 1e-3)])
    assert len(seen) == 2 and [r.round for r in res.history] == [0, 1, 2]
    assert seen[0][k] < 0.5 * start_scores[k]
    assert res.measured[0] == ws[k] and len(res.measured) == 3


def test_initial_measurements_are_checked(domain, data):
    ws = [Workload("group", ("TEN",))]
    true = exact_normalised_answers(data, ws)
    cfg = HGEMSettings(rounds=0, initial_share=Fraction(1), **CFG)
    with pytest.raises(ValueError, match="rounds"):
        train_hgem(domain, ws, score_select(true, _no_rounds, 1e-3), _no_rounds, cfg, prior_households=0.0, device="cpu")
    with pytest.raises(ValueError, match="cells"):
        train_hgem(domain, ws, score_select(true, _no_rounds, 1e-3), _no_rounds, cfg, prior_households=0.0, device="cpu",
                   initial=[NormalisedMeasurement(ws[0], np.zeros(len(true[0]) + 1), 1e-3)])
    with pytest.raises(ValueError, match="sigma"):
        train_hgem(domain, ws, score_select(true, _no_rounds, 1e-3), _no_rounds, cfg, prior_households=0.0, device="cpu",
                   initial=[NormalisedMeasurement(ws[0], true[0], 0.0)])


def test_map_round_keeps_its_best_iterate(domain, data):
    """A learning rate far too large makes Adam overshoot: the round must still end at the lowest
    loss it saw (never above its start), with the max error of that iterate."""
    from engine.hgem.steps import AdamSteps, make_adam
    from engine.hgem.updates import map_update

    ws = kway_workloads(domain, 2)[:6]
    true = exact_normalised_answers(data, ws)
    cfg = HGEMSettings(rounds=1, **{**CFG, "update": "map", "update_tol": 0.0})
    G = make_generator(domain, cfg, 0, "cpu")
    plan = AnswerPlan(domain, ws, device="cpu")
    tgt = plan.concat_targets(true)
    w_m = torch.full_like(tgt, 0.5 / 1e-3**2)

    def loss_now():
        with torch.no_grad():
            return float((w_m * (plan.answers(G()) - tgt) ** 2).sum())

    start = loss_now()
    losses = []
    runner = AdamSteps(make_adam(G.parameters(), 3.0, G.device), False)  # lr 3: wild steps
    orig = runner.run

    def spy(evaluate, loss_of, stop, max_steps):
        def stop_spy(i, stats):
            losses.append(float(stats[0]))
            return stop(i, stats)
        return orig(evaluate, loss_of, stop_spy, max_steps)

    runner.run = spy
    steps, _, max_err = map_update(G, runner, cfg, plan, tgt, w_m, None, 30)
    assert steps == len(losses) - 1 and losses[-1] > min(losses)  # the last iterate is not the best one
    assert loss_now() == pytest.approx(min(losses), rel=1e-6) and loss_now() <= start
    with torch.no_grad():
        assert max_err == pytest.approx(float(plan.max_abs_error(plan.answers(G()), tgt).max()), rel=1e-6)
