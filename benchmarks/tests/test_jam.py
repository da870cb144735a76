"""JAM (benchmarks/peers/jam.py), the peer that uses public data: its accounting (ρ spent to the
budget, public measurements free, the adaptive split), the sensitivity of its selection qualities
on worst-case neighbours, and its behaviour on a small slice of Vermont: public data equal to the
private data is chosen and beats AIM at a tiny ε, adversarial public data is left alone. Skipped
when the ``bench`` extra (mbi) is not installed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import load_benchmark

pytest.importorskip("mbi")

RHO = 0.001  # tiny: ε ≈ 0.2 at δ = 1e-6, where private measurements of 3-way marginals are mostly noise
ROUNDS, ITERS = 6, 40
SMALL = dict(rounds=ROUNDS, max_iters=ITERS, max_model_size=1.0)  # every run's size here


@pytest.fixture(scope="module", autouse=True)
def pc():
    return load_benchmark("peer_comparison")  # puts benchmarks/ on the path: ``peers`` imports as the benchmark does


@pytest.fixture(scope="module")
def slice_(pc, data_root):
    """2,000 Vermont persons on AGEP_BAND, SEX, RELP_GROUP, NP: the private data, its domain and workload."""
    from peers import jam

    bench = pc.Bench("vt", 7)
    cols = (0, 1, 7, 9)
    names = tuple(pc.ATTRS[i] for i in cols)
    domain = jam.mbi.Domain(names, [bench.shape[i] for i in cols])
    rows = bench.truth[:2000][:, cols]
    data = jam.mbi.Dataset({a: rows[:, j] for j, a in enumerate(names)}, domain)
    return data, [(t, 1.0) for t in itertools.combinations(names, 3)]


def workload_error(data, synth, workload) -> float:
    return float(np.mean([np.abs(data.project(cl).datavector() / data.records - synth.project(cl).datavector() / synth.records).sum()
                          for cl, _ in workload]))


@pytest.fixture(scope="module")
def runs(slice_):
    """JAM with public data equal to the private data, with adversarial public data (every record in
    one cell) and without public data, at the same tiny ρ."""
    from peers import jam

    data, workload = slice_
    adversarial = jam.mbi.Dataset({a: np.zeros(data.records, dtype=np.int64) for a in data.domain.attributes}, data.domain)
    out = {}
    for name, public in (("same", data), ("adversarial", adversarial), ("none", None)):
        out[name] = jam.run(data, public, workload, RHO, rng=np.random.default_rng(3), **SMALL)
    return out


def test_rho_charged_is_the_budget_and_public_measurements_are_free(runs):
    from peers.jam import adaptive_split

    for _, _, info in runs.values():
        if info is None:
            continue
        kinds = [s.split(":")[0] for s in info["selected"]]
        used = info["rho_total_count"]
        assert used == pytest.approx(0.02 * RHO)
        for t, (kind, (rs, rm)) in enumerate(zip(kinds, info["charges"])):
            want_s, want_m = adaptive_split(RHO, used, ROUNDS, t, 0.2)
            assert rs == pytest.approx(want_s, rel=1e-12)
            assert rm == (0.0 if kind == "PUB" else pytest.approx(want_m, rel=1e-12))  # a public measurement costs no ρ
            used += rs + rm
        assert info["rho_used"] == pytest.approx(used, rel=1e-12)
        if kinds[-1] == "PRIV":  # the last round spends whatever is left
            assert info["rho_used"] == pytest.approx(RHO, rel=1e-12)
        else:  # a public last round leaves its measurement share unspent
            assert info["rho_used"] < RHO
    assert runs["none"][2]["public_selections"] == 0 and runs["none"][2]["rho_used"] == pytest.approx(RHO, rel=1e-12)
    same = runs["same"][2]
    assert same["public_selections"] > 0 and (same["rho_used"] < RHO) == same["selected"][-1].startswith("PUB")


def test_a_small_domain_run_returns_data_over_the_domain(slice_, runs):
    data, _ = slice_
    for name in ("same", "adversarial", "none"):
        _, synth, _ = runs[name]
        assert synth.domain == data.domain
        for a, size in zip(data.domain.attributes, data.domain.shape):
            col = np.asarray(synth.data[a])
            assert col.min() >= 0 and col.max() < size
        assert abs(synth.records - data.records) < 0.5 * data.records  # N̂: the noisy count, σ ≈ 158 here


SEEDS = range(4)  # at this ε the selection is nearly uniform: which cliques a run measures is luck, so the comparison averages runs


def test_jam_uses_faithful_public_data_and_leaves_adversarial_data_alone(slice_, runs):
    """Public data equal to the private data: JAM picks it in most rounds, and its error, averaged
    over four seeds, is under half AIM's on the same seeds (free, exact measurements against noise at
    a tiny ε; one seed alone can measure the same clique in every round and miss the rest).
    Adversarial public data: hardly picked, and no harm done. The runs are reproducible from their
    seeds (the candidates' order no longer depends on Python's hash seed)."""
    from peers import aim, jam

    data, workload = slice_
    # half the rounds at least: a one-way private measurement can beat a public one off by |N̂ − N| ≈ 158
    assert runs["same"][2]["public_selections"] >= ROUNDS // 2
    same = [workload_error(data, jam.run(data, data, workload, RHO, rng=np.random.default_rng(s), **SMALL)[1], workload) for s in SEEDS]
    base = [workload_error(data, aim.run(data, workload, RHO, rng=np.random.default_rng(s), **SMALL)[1], workload) for s in SEEDS]
    assert np.mean(same) < 0.5 * np.mean(base)  # the free, exact public measurements beat AIM's noise
    err = {name: workload_error(data, runs[name][1], workload) for name in ("adversarial", "none")}
    assert runs["adversarial"][2]["public_selections"] <= 1
    assert err["adversarial"] < 1.5 * err["none"]  # ... and are not used to the private data's harm


def test_selection_qualities_move_by_at_most_their_sensitivity_on_worst_case_neighbours():
    """A neighbour adds a unit of Δ records in one cell. Worst case for a public quality: the model
    above the private answer and the public answer below it there, so both L1 terms move by Δ in
    opposite directions: 2Δ, the sensitivity the selection uses; a private quality moves by Δ."""
    from peers.jam import scores

    delta = 7.0
    cl = ("A", "B")
    x = np.array([10.0, 20.0, 30.0])
    model = np.array([30.0, 20.0, 10.0])  # above x in cell 0
    public = np.array([0.0, 30.0, 30.0])  # below x in cell 0
    neighbour = x + np.array([delta, 0.0, 0.0])
    before = scores({cl: x}, {cl: model}, {cl: public}, 5.0, {cl: 3})
    after = scores({cl: neighbour}, {cl: model}, {cl: public}, 5.0, {cl: 3})
    moved = {k: abs(after[k] - before[k]) for k in before}
    assert moved[cl, "PUB"] == pytest.approx(2 * delta)  # attained: Δ would be too small a sensitivity
    assert moved[cl, "PRIV"] == pytest.approx(delta)
    # any neighbour (up to Δ records added or removed anywhere) stays within 2Δ
    rng = np.random.default_rng(0)
    for _ in range(200):
        change = rng.multinomial(int(delta), rng.dirichlet(np.ones(3))) * rng.choice([-1, 1])
        after = scores({cl: x + change}, {cl: model}, {cl: public}, 5.0, {cl: 3})
        assert abs(after[cl, "PUB"] - before[cl, "PUB"]) <= 2 * delta + 1e-9
        assert abs(after[cl, "PRIV"] - before[cl, "PRIV"]) <= delta + 1e-9
    # before the first measurement the model's error counts as 0 for both kinds
    first = scores({cl: x}, None, {cl: public}, 5.0, {cl: 3})
    assert first[cl, "PUB"] == -np.abs(x - public).sum() and first[cl, "PRIV"] == pytest.approx(-np.sqrt(2 / np.pi) * 15.0)
