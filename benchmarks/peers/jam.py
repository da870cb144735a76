"""JAM: Joint Adaptive Measurements, AIM-style selection that may also pick free public measurements.

Fuentes, Mullins, McKenna, Miklau, Sheldon, "Joint Selection: Adaptively Incorporating Public
Information for Private Synthetic Data", AISTATS 2024 (PMLR 238:2404-2412).

Each round one exponential mechanism chooses among (clique, private) and (clique, public)
candidates: a private candidate scores the model's L1 error on the clique minus the expected L1
error of a Gaussian measurement of it; a public candidate scores the model's error minus the public
data's L1 error against the private marginal (computed on the private data: that is why the
selection is private). A private choice measures the clique with Gaussian noise; a public choice
adds the public marginal, scaled to the private total, as a measurement that costs no ρ, and the
budget it would have spent moves to later rounds (adaptive split: round t gets the remaining ρ over
the remaining rounds, a share α of it for selection).

Adapted from the reference implementation ``mechanisms/jam.py`` of private-pgm
(github.com/ryan112358/private-pgm @ 576a637, Apache-2.0) onto ``mbi`` 2.0.0 with the pieces of
``aim.py`` (candidates, model marginals in numpy, mirror-descent estimation with a warm start).
Deviations from the reference:
  * neighbours are add/remove one unit changing every marginal by up to ``sensitivity`` (Δ) in L1
    and L2, not the reference's bounded (replace-one) DP: the Gaussian noise is Δ/√(2ρ_measure)
    (reference: √2/√(2ρ_measure)) and the exponential mechanism's quality sensitivity 2Δ (each of
    the public score's two L1 terms moves by up to Δ; the reference uses 2 for its bounded
    neighbourhood);
  * the private record count is not public under add/remove DP (the reference scales public
    answers by the exact count and samples that many rows): a share ``total_share`` of ρ first
    buys a Gaussian count N̂ (noise Δ/√(2ρ_total)); public answers are scaled to N̂, every
    estimation takes N̂ as the known total and the synthetic data has N̂ rows;
  * the public data may lack attributes of the private domain (here the private state's PUMAs,
    which no public state has): cliques over such attributes are private candidates only;
  * a candidate in the downward closure of the measured cliques is kept without computing its
    hypothetical model size (the reference exempts only the measured cliques themselves);
  * the model's marginals for the scores come from :class:`aim.Marginals` (numpy, the same
    numbers as ``model.project``); the final estimation warm-starts from the last model;
  * progress goes to a ``log`` callable, randomness to a numpy ``Generator``.
As in the reference, the scores carry no workload weights and every measurement, private or
public, enters the estimation with stddev 1.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import numpy as np

from .aim import Marginals, _estimate, downward_closure
from .common import exponential_mechanism, import_mbi

mbi = import_mbi()


def adaptive_split(rho: float, rho_used: float, rounds: int, t: int, alpha: float) -> tuple[float, float]:
    """Round ``t``'s (selection, measurement) budget: the remaining ρ over the remaining rounds,
    a share ``alpha`` of it for the selection."""
    per_round = max(rho - rho_used, 0.0) / (rounds - t)
    return alpha * per_round, (1 - alpha) * per_round


def scores(answers: dict, model_answers: dict | None, pub_answers: dict, sigma: float, cells: dict) -> dict:
    """The exponential mechanism's qualities of a round's candidates (the cliques of ``answers``):
    (clique, "PRIV"): the model's L1 error minus a Gaussian measurement's expected L1 error
    √(2/π)·σ·cells; (clique, "PUB") for the cliques with a public answer: the model's error minus
    the public answer's. Before the first measurement the model's error counts as 0.
    A neighbour moving each private answer by up to Δ in L1 moves a private quality by up to Δ and
    a public one by up to 2Δ (both of its terms)."""
    out = {}
    for cl, x in answers.items():
        model_error = float(np.abs(x - model_answers[cl]).sum()) if model_answers is not None else 0.0
        out[cl, "PRIV"] = model_error - math.sqrt(2 / math.pi) * sigma * cells[cl]
        if cl in pub_answers:
            out[cl, "PUB"] = model_error - float(np.abs(x - pub_answers[cl]).sum())
    return out


def _counts(data, cl) -> np.ndarray:
    return np.asarray(data.project(cl).datavector(), dtype=np.float64)


def run(
    data,
    public,
    workload: list[tuple[tuple[str, ...], float]],
    rho: float,
    *,
    rng: np.random.Generator,
    sensitivity: float = 1.0,
    rounds: int = 30,
    alpha: float = 0.2,
    total_share: float = 0.02,
    max_model_size: float = 80.0,
    max_iters: int = 1000,
    log: Callable[[str], None] = lambda s: None,
):
    """JAM on ``data`` (an ``mbi.Dataset``) at ρ-zCDP with ``public`` (an ``mbi.Dataset`` over some
    of its attributes, or None: AIM-like selection among private measurements only).
    Returns (model, synthetic Dataset, info)."""
    t_start = time.perf_counter()
    D = float(sensitivity)
    domain = data.domain
    candidates = list(downward_closure([cl for cl, _ in workload]))
    answers = {cl: _counts(data, cl) for cl in candidates}
    pub_attrs = set(public.domain.attributes) if public is not None else set()
    pub_share = {cl: _counts(public, cl) / public.records for cl in candidates if set(cl) <= pub_attrs}

    rho_total = total_share * rho
    total = max(float(data.records + rng.normal(0.0, D / math.sqrt(2 * rho_total))), 1.0)
    rho_used = rho_total
    pub_answers = {cl: total * p for cl, p in pub_share.items()}
    log(f"JAM: N̂ from {total_share:.0%} of ρ, {len(candidates)} candidates ({len(pub_share)} also public), T={rounds}")

    measurements: list = []
    measured: list[tuple[str, ...]] = []
    model = None
    charges = []  # per round: (clique, "PRIV" | "PUB", ρ of the selection, ρ of the measurement)
    for t in range(rounds):
        rho_select, rho_measure = adaptive_split(rho, rho_used, rounds, t, alpha)
        epsilon = math.sqrt(8 * rho_select)
        sigma = D / math.sqrt(2 * rho_measure)
        size_limit = max_model_size / rounds if t == 0 else max_model_size * rho_used / rho
        free = set(downward_closure(measured))
        small = [cl for cl in candidates
                 if cl in free or mbi.junction_tree.hypothetical_model_size(domain, measured + [cl]) <= size_limit]

        marg = Marginals(model) if model is not None else None
        quality = scores({cl: answers[cl] for cl in small}, None if marg is None else {cl: marg(cl) for cl in small}, pub_answers, sigma,
                         {cl: domain.size(cl) for cl in small})
        cl, kind = exponential_mechanism(quality, epsilon, 2 * D, rng)
        rho_used += rho_select
        if kind == "PRIV":
            y = answers[cl] + rng.normal(0.0, sigma, answers[cl].size)
            rho_used += rho_measure
            charges.append((cl, kind, rho_select, rho_measure))
        else:
            y = pub_answers[cl]
            charges.append((cl, kind, rho_select, 0.0))
        measurements.append(mbi.LinearMeasurement(y, cl, stddev=1.0))
        if cl not in measured:
            measured.append(cl)
        model = _estimate(domain, measurements, max_iters, warm_start=model, known_total=total)
        if t == 0 or (t + 1) % 10 == 0 or t == rounds - 1:
            log(f"JAM round {t + 1}/{rounds}: {kind} {cl} (σ={sigma:.1f}, ε_sel={epsilon:.3g}), ρ used {rho_used / rho:.1%}, "
                f"{sum(k == 'PUB' for _, k, _, _ in charges)} public so far, {time.perf_counter() - t_start:.0f}s")

    model = _estimate(domain, measurements, max_iters, warm_start=model, known_total=total)
    synth = model.synthetic_data(rows=int(round(total)))
    info = {
        "rounds_T": rounds,
        "alpha": alpha,
        "total_share": total_share,
        "rho_used": rho_used,
        "rho_total_count": rho_total,
        "selected": [f"{kind}:{'|'.join(cl)}" for cl, kind, _, _ in charges],
        "public_selections": sum(kind == "PUB" for _, kind, _, _ in charges),
        "charges": [[rs, rm] for _, _, rs, rm in charges],
        "model_size_mb": float(mbi.junction_tree.hypothetical_model_size(domain, list(model.cliques))),
    }
    return model, synth, info
