"""PMW-Pub (Liu, Vietri, Steinke, Ullman, Wu — "Leveraging Public Data for Practical Private Query
Release", ICML 2021), a baseline of the synthesis benchmark (never a release path): adaptive rounds
of selection of the worst workload, a Gaussian measurement, and the multiplicative weights update
over the public support, replaying past measurements (their §4.3). Selection and measurement are
callables (the benchmark binds local noise). With a uniform prior it is MWEM over the public
domain (the paper's ablation, Fig. 8)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from engine.queries import PrivacyUnit, Support, Workload, normalise_counts

__all__ = ["PMWPubResult", "mw_update", "pmw_pub"]


@dataclass
class PMWPubResult:
    weights: np.ndarray            # the output distribution (average of the iterates, PMW-Pub Alg. 1)
    last: np.ndarray               # the last iterate A_T
    selected: list[str]            # workload ids in selection order
    history: list[dict] = field(default_factory=list)


def mw_update(q: np.ndarray, A: sp.csr_matrix, y: np.ndarray, step: float) -> np.ndarray:
    """Multiplicative weights with a whole measured workload (MWEM / PMW-Pub update rule):
    ``q_h ∝ q_h exp(step · Σ_c A[c, h] (y_c − (A q)_c))`` (PMW-Pub §3.2 uses step 1/2 for a query
    with values in [0, 1]; here the step is divided by the largest entry of A)."""
    amax = float(A.data.max()) if A.nnz else 1.0
    u = (A.T @ (y - A @ q)) * (step / amax)
    z = q * np.exp(u - u.max())
    return z / z.sum()


def pmw_pub(
    support: Support,
    workloads: Sequence[Workload],
    true_counts: Sequence[np.ndarray],
    select: Callable[[np.ndarray, float], int],
    measure: Callable[[Workload], np.ndarray],
    *,
    unit: PrivacyUnit,
    total: float,
    T: int,
    prior: np.ndarray | None = None,
    step: float = 0.5,
    replay_passes: int = 3,
    allow_repeats: bool = False,
    rng: np.random.Generator | None = None,
    average: bool = True,
) -> PMWPubResult:
    """PMW-Pub (Liu et al., Alg. 1, with the §4.3 replay of past measurements) on the support.

    Round t: scores ``s_w = ||Ñ · A_w q − x_w||₁ / Δ₁(w)`` (model counts at the public/noisy total
    ``total`` vs the exact private counts ``true_counts``, divided by the workload's L1 sensitivity
    under the privacy ``unit`` so every score has sensitivity 1); ``select(scores, 1.0)`` (permute-and-flip through
    the ledger) returns the index; ``measure(w)`` returns noisy counts (Gaussian through the ledger);
    the answers are normalised by ``total`` and clipped to the range one household can produce
    (PMW-Pub clips to [0, 1]). Then the MW update (:func:`mw_update`) with the new measurement and
    ``replay_passes`` passes, in random order, over all past measurements whose current error is
    at least half the largest (§4.3). ``true_counts`` are used only inside the scores handed to
    ``select``. Output: the average of the iterates (``average=True``, as in the paper) or the last.
    With ``prior=uniform`` this is MWEM over the public domain (the paper's ablation, Fig. 8).
    """
    if len(workloads) != len(true_counts):
        raise ValueError("one true count vector per workload")
    rng = rng if rng is not None else np.random.default_rng(0)
    d = support.data.domain
    q = np.asarray(support.weights if prior is None else prior, dtype=np.float64)
    q = q / q.sum()
    mats = [support.incidence(w) for w in workloads]
    sens = np.array([w.sensitivity(d, unit)[0] for w in workloads])
    truth = [np.asarray(x, dtype=np.float64) for x in true_counts]
    candidates = list(range(len(workloads)))
    measured: list[tuple[int, np.ndarray]] = []
    avg = np.zeros_like(q)
    history = []
    for t in range(1, T + 1):
        if not candidates:
            break
        scores = np.array([np.abs(total * (mats[i] @ q) - truth[i]).sum() / sens[i] for i in candidates])
        k = candidates[int(select(scores, 1.0))]
        if not allow_repeats:
            candidates.remove(k)
        noisy = normalise_counts(measure(workloads[k]), total)
        amax = float(mats[k].data.max()) if mats[k].nnz else 1.0
        noisy = np.clip(noisy, 0.0, amax)
        measured.append((k, noisy))
        q = mw_update(q, mats[k], noisy, step)
        for _ in range(replay_passes):
            errs = np.array([np.abs(mats[i] @ q - y).sum() for i, y in measured])
            keep = [j for j in rng.permutation(len(measured)) if errs[j] >= errs.max() / 2]
            for j in keep:
                i, y = measured[j]
                q = mw_update(q, mats[i], y, step)
        avg += q
        history.append({"round": t, "selected": workloads[k].id, "max_score": float(scores.max())})
    n = max(len(history), 1)
    return PMWPubResult(
        weights=avg / n if average and history else q,
        last=q,
        selected=[workloads[i].id for i, _ in measured],
        history=history,
    )
