"""PMW-Pub (benchmarks/peers/pmw_pub.py), the synthesis benchmark's MWEM baseline: the rounds go
through the injected selection and measurement callables and reduce the workload error."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.peers.pmw_pub import pmw_pub
from engine.queries import Support, answer
from tests.engine._support_testdata import random_data
from tests.engine.test_prior_update import DOMAIN, WORKLOADS  # the prior update's test set-up


def test_pmw_pub_rounds_use_the_callables_and_reduce_error():
    rng = np.random.default_rng(15)
    pub = Support.from_data(random_data(DOMAIN, 300, seed=16, dependence=0.2))
    priv = random_data(DOMAIN, 500, seed=17, dependence=0.9)
    ws = WORKLOADS
    truth = [answer(priv, w) for w in ws]
    seen = []

    def select(scores, sensitivity):
        seen.append((scores.copy(), sensitivity))
        return int(np.argmax(scores))

    measured = []

    def measure(w):
        measured.append(w)
        return answer(priv, w) + rng.normal(0, 1.0, w.n_cells(DOMAIN))

    def err(q):
        return sum(np.abs(pub.answer(w, q) * priv.n_households - t).sum() for w, t in zip(ws, truth))

    res = pmw_pub(pub, ws, truth, select, measure, unit="household", total=priv.n_households, T=4, rng=rng)
    assert len(seen) == 4 and all(sv == 1.0 for _, sv in seen)
    assert [len(sc) for sc, _ in seen] == [5, 4, 3, 2]  # no repeats by default
    assert res.selected == [w.id for w in measured] and len(set(res.selected)) == 4
    assert err(res.last) < err(pub.weights)
    assert res.weights.sum() == pytest.approx(1.0)
    # MWEM from uniform over the public support (PMW-Pub's ablation) runs through the same code
    res_u = pmw_pub(pub, ws, truth, select, measure, unit="person", total=priv.n_households, T=3, prior=pub.uniform().weights)
    assert len(res_u.selected) == 3
