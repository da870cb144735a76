"""AIM: An Adaptive and Iterative Mechanism for differentially private synthetic data.

McKenna, Mullins, Sheldon, Miklau, "AIM: An Adaptive and Iterative Mechanism for Differentially
Private Synthetic Data", PVLDB 15(11), 2022 (arXiv:2201.12677), Algorithm 1.

Adapted from the reference implementation ``mechanisms/aim.py`` of private-pgm
(github.com/ryan112358/private-pgm @ 4d2b3c5, Apache-2.0) onto ``mbi`` 2.0.0:
``estimation.MirrorDescent().estimate`` replaces ``estimation.mirror_descent`` (warm start through
``warm_start=`` instead of ``potentials=``), ``junction_tree.hypothetical_model_size`` and
``MarkovRandomField.synthetic_data`` as in the reference. Changes, none of which alters the
mechanism's output distribution or its privacy accounting:
  * ``sensitivity`` (Δ, default 1 = add/remove one record, the paper's setting) scales the Gaussian
    noise (σ·Δ) and the exponential mechanism's quality sensitivity (Δ·max|w|), so that the same
    ρ is spent when a neighbour changes every marginal by up to Δ in L1 and L2 (e.g. a household
    of up to Δ persons);
  * a candidate already in the downward closure of the model is kept without computing its
    hypothetical model size (the reference computes both conditions, keeping either);
  * the initial one-way measurements are charged by their number (the reference charges
    ``len(oneway)``, which is the same number when ``initial_cliques`` is left empty);
  * the final "Generating Data" estimation warm-starts from the last model (the reference
    re-estimates from the last round's expanded potentials: the same warm start);
  * progress goes to a ``log`` callable, randomness to a numpy ``Generator``.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import numpy as np

from .common import exponential_mechanism, import_mbi

mbi = import_mbi()


def powerset(iterable):
    """powerset([1,2,3]) --> (1,) (2,) (3,) (1,2) (1,3) (2,3) (1,2,3)"""
    s = list(iterable)
    return itertools.chain.from_iterable(itertools.combinations(s, r) for r in range(1, len(s) + 1))


def downward_closure(Ws):
    """Every non-empty subset of the cliques ``Ws``, smallest first. Ties are ordered by the
    cliques themselves: the reference sorts by length alone, which leaves equal lengths in the
    set's order, and that changes with Python's hash seed from process to process (the
    exponential mechanism's draw then picks a different clique for the same seed)."""
    ans = set()
    for proj in Ws:
        ans.update(powerset(proj))
    return sorted(ans, key=lambda cl: (len(cl), cl))


def compile_workload(workload):
    """Candidate cliques (the workload's downward closure) with their weights
    w_r = Σ_s c_s |r ∩ s| (paper, Section 4.2)."""
    weights = {cl: wt for (cl, wt) in workload}

    def score(cl):
        return sum(weights[wcl] * len(set(cl) & set(wcl)) for wcl in weights)

    return {cl: score(cl) for cl in downward_closure(weights)}


def filter_candidates(candidates, model, size_limit):
    """Candidates whose addition keeps the junction tree within ``size_limit`` MB, or that are
    free (in the downward closure of the model's cliques)."""
    free = set(downward_closure(model.cliques))
    cliques = list(model.cliques)
    ans = {}
    for cl in candidates:
        if cl in free or mbi.junction_tree.hypothetical_model_size(model.domain, cliques + [cl]) <= size_limit:
            ans[cl] = candidates[cl]
    return ans


def _estimate(domain, measurements, iters, warm_start=None, known_total=None):
    return mbi.estimation.MirrorDescent().estimate(domain, measurements, iters=iters, warm_start=warm_start, known_total=known_total)


class Marginals:
    """Exact marginals of a fitted model on any clique, in numpy.

    ``MarkovRandomField.project`` answers a clique outside the measured ones by variable
    elimination in eager JAX, which compiles anew for every clique and every model structure
    (~0.4 s each here, i.e. minutes per round for 231 candidates). The same numbers come from one
    numpy ``einsum`` over the exponentiated potentials, first summed into the junction tree's
    maximal cliques (≤ d operands), normalised to the model's total; measured cliques are read
    from the model's marginals. Pure post-processing of the model: the mechanism is unchanged.
    """

    def __init__(self, model):
        self.total = float(model.total)
        dom = model.domain
        self.axis = {a: i for i, a in enumerate(dom.attributes)}
        self.measured = [(tuple(f.domain.attributes), np.asarray(f.values, dtype=np.float64)) for f in model.marginals.tables.values()]
        jtree, _ = mbi.junction_tree.make_junction_tree(dom, [tuple(c) for c in model.cliques])
        nodes = [tuple(n) for n in jtree.nodes]
        logs = {n: np.zeros(dom.project(n).shape) for n in nodes}
        for f in model.potentials.tables.values():
            attrs = tuple(f.domain.attributes)
            n = next(n for n in nodes if set(attrs) <= set(n))
            logs[n] = logs[n] + self._broadcast(np.asarray(f.values, dtype=np.float64), attrs, n)
        self.operands = []
        for n, L in logs.items():
            self.operands += [np.exp(L - L.max()), [self.axis[a] for a in n]]
        self.cache: dict = {}

    @staticmethod
    def _broadcast(values, attrs, target):
        order = [a for a in target if a in attrs]
        v = np.transpose(values, [attrs.index(a) for a in order])
        return v.reshape([v.shape[order.index(a)] if a in attrs else 1 for a in target])

    def __call__(self, cl) -> np.ndarray:
        cl = tuple(cl)
        if cl in self.cache:
            return self.cache[cl]
        for attrs, arr in self.measured:
            if set(cl) <= set(attrs):
                out = arr.sum(axis=tuple(i for i, a in enumerate(attrs) if a not in cl))
                rest = [a for a in attrs if a in cl]
                out = np.transpose(out, [rest.index(a) for a in cl])
                break
        else:
            out = np.einsum(*self.operands, [self.axis[a] for a in cl], optimize="greedy")
            out = out * (self.total / out.sum())
        self.cache[cl] = out.ravel()
        return self.cache[cl]


def _datavector(model, cl) -> np.ndarray:
    return np.asarray(model.project(cl).datavector(), dtype=np.float64)


def run(
    data,
    workload: list[tuple[tuple[str, ...], float]],
    rho: float,
    *,
    rng: np.random.Generator,
    sensitivity: float = 1.0,
    rounds: int | None = None,
    max_model_size: float = 80.0,
    max_iters: int = 1000,
    num_synth_rows: int | None = None,
    initial_cliques=None,
    log: Callable[[str], None] = lambda s: None,
):
    """AIM on ``data`` (an ``mbi.Dataset``) at ρ-zCDP. Returns (model, synthetic Dataset, info)."""
    t_start = time.perf_counter()
    d = len(data.domain)
    rounds = rounds or 16 * d
    candidates = compile_workload(workload)
    answers = {cl: np.asarray(data.project(cl).datavector(), dtype=np.float64) for cl in candidates}
    if not initial_cliques:
        initial_cliques = [cl for cl in candidates if len(cl) == 1]  # one-way marginals

    # σ, ε in units of the sensitivity; the noise actually added is σ·Δ
    sigma = math.sqrt(rounds / (2 * 0.9 * rho))
    epsilon = math.sqrt(8 * 0.1 * rho / rounds)
    D = float(sensitivity)

    measurements = []
    rho_used = len(initial_cliques) * 0.5 / sigma**2
    if rho_used >= rho:
        raise ValueError(f"rounds T={rounds} too small: the {len(initial_cliques)} initial measurements alone would spend "
                         f"{rho_used / rho:.0%} of ρ (T must exceed 0.9 × their number)")
    for cl in initial_cliques:
        x = answers[cl] if cl in answers else np.asarray(data.project(cl).datavector(), dtype=np.float64)
        y = x + rng.normal(0.0, sigma * D, x.size)
        measurements.append(mbi.LinearMeasurement(y, cl, stddev=sigma * D))
    model = _estimate(data.domain, measurements, max_iters)
    log(f"AIM: {len(initial_cliques)} one-way marginals measured (σ={sigma * D:.1f}), {len(candidates)} candidates, T={rounds}")

    selected, sigma_halvings = [], 0
    t = 0
    terminate = False
    while not terminate:
        t += 1
        if rho - rho_used < 2 * (0.5 / sigma**2 + 1.0 / 8 * epsilon**2):
            # use up whatever budget remains in one last round
            remaining = rho - rho_used
            sigma = math.sqrt(1 / (2 * 0.9 * remaining))
            epsilon = math.sqrt(8 * 0.1 * remaining)
            terminate = True
        rho_used += 1.0 / 8 * epsilon**2 + 0.5 / sigma**2
        size_limit = max_model_size * rho_used / rho

        small = filter_candidates(candidates, model, size_limit)
        # worst-approximated candidate by the exponential mechanism (quality sensitivity Δ·|w|)
        s = sigma * D
        marg = Marginals(model)
        errors = {}
        for cl, wgt in small.items():
            bias = math.sqrt(2 / math.pi) * s * model.domain.size(cl)
            errors[cl] = wgt * (np.abs(answers[cl] - marg(cl)).sum() - bias)
        max_sensitivity = D * max(abs(w) for w in small.values())
        cl = exponential_mechanism(errors, epsilon, max_sensitivity, rng)
        selected.append(cl)

        n = data.domain.size(cl)
        x = answers[cl]
        y = x + rng.normal(0.0, s, n)
        measurements.append(mbi.LinearMeasurement(y, cl, stddev=s))
        z = marg(cl)
        model = _estimate(data.domain, measurements, max_iters, warm_start=model)
        w = _datavector(model, cl)  # measured now: read from the model's marginals
        if np.abs(w - z).sum() <= s * math.sqrt(2 / math.pi) * n:
            sigma /= 2
            epsilon *= 2
            sigma_halvings += 1
            log(f"AIM round {t}: model barely moved on {cl}: σ halved to {sigma * D:.1f}")
        if t == 1 or t % 10 == 0 or terminate:
            log(f"AIM round {t}: measured {cl} (σ={s:.1f}), ρ used {rho_used / rho:.1%}, "
                f"model {mbi.junction_tree.hypothetical_model_size(model.domain, list(model.cliques)):.2f} MB "
                f"(limit {size_limit:.2f}), {time.perf_counter() - t_start:.0f}s")

    model = _estimate(data.domain, measurements, max_iters, warm_start=model)
    synth = model.synthetic_data(rows=num_synth_rows)
    info = {
        "rounds_run": t,
        "rounds_T": rounds,
        "sigma_halvings": sigma_halvings,
        "rho_used": rho_used,
        "selected": ["|".join(c) for c in selected],
        "model_size_mb": float(mbi.junction_tree.hypothetical_model_size(model.domain, list(model.cliques))),
        "estimated_total": float(model.total),
    }
    return model, synth, info
