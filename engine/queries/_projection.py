"""Projections on a support of public households (Tao, Bater, Machanavajjhala — "Prior-Aware
Distribution Estimation for Differential Privacy"), the building blocks of the prior update
(:mod:`engine.synthesis._prior_update`):

- :func:`project_simplex_l1` — Algorithm 1 lines 6–10, the L1-optimal feasible answers
  ``y_s = argmin ||y − ỹ_s||₁  s.t. y ≥ 0, Σy = 1`` (or ``Σy ≤ 1`` for a partial workload);
- :func:`least_relative_entropy_update` — Definition 3.1 (all four cases), the closed form of
  ``argmin_q KL(q ‖ p) s.t. W_s q = y_s`` for a partial workload whose rows are disjoint
  (‖W_s‖₁ = 1, Theorem 3.1);
- for workloads that are **not** partitions of the households (group-level "contains" queries and
  person-level counts, H-GEM Table 1) Definition 3.1 does not apply: a household can lie in
  several cells, or count several times in one. For those, the same two-stage problem of Tao et al.
  §3.1 is solved exactly on the support:
  - stage 1 (:func:`project_to_hull_l1`): ``y* = argmin ||y − ỹ||₁`` over the answers that some
    distribution on the support can produce, ``y ∈ {A z : z ≥ 0, Σz = 1}`` (a linear program on the
    distinct incidence columns; ties broken towards the current model's answers by a second LP);
  - stage 2 (:func:`entropy_projection`): the I-projection ``argmin_z KL(z ‖ q) s.t. A z = y*``,
    whose solution has the Lagrangian form of Tao et al. eq. (3),
    ``z_h = q_h exp(λᵀ A[:, h]) / Z(λ)``; λ minimises the convex dual
    ``log Σ_h q_h exp(λᵀ A[:, h]) − λᵀ y*`` and is found by damped Newton iterations. For a
    partition this reproduces Definition 3.1 (tested).
- :func:`kl_divergence`, KL(q ‖ p) (Definition 2.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import linprog

from engine.queries._queries import Patterns

__all__ = ["ProjectionInfo", "SimplexMethod", "entropy_projection", "kl_divergence", "least_relative_entropy_update",
           "project_simplex_l1", "project_to_hull_l1"]

SimplexMethod = Literal["euclidean", "proportional"]


# ============================================================ Algorithm 1 lines 6–10 (L1 projection)
def project_simplex_l1(
    y_noisy: np.ndarray,
    *,
    total: float = 1.0,
    partial: bool = False,
    allowed: np.ndarray | None = None,
    method: SimplexMethod = "euclidean",
    fallback: np.ndarray | None = None,
) -> np.ndarray:
    """An exact minimiser of ``||y − ỹ||₁`` s.t. ``y ≥ 0``, ``Σy = total`` (``≤ total`` if partial),
    and ``y_c = 0`` where ``allowed`` is False (cells without any support point, Tao et al. §3.2).

    Why the choice below is optimal: for every y ≥ 0, ``||y − ỹ||₁ = ||y − ỹ⁺||₁ + ||ỹ⁻||₁``
    (ỹ⁺ = max(ỹ, 0) on allowed cells, ỹ⁻ the rest), so the problem is the projection of ỹ⁺, and
    ``||y − ỹ⁺||₁ ≥ |total − Σỹ⁺|`` with equality exactly when y moves every coordinate in the same
    direction: ``y ≤ ỹ⁺`` when Σỹ⁺ > total ("shrink"), ``y ≥ ỹ⁺`` when Σỹ⁺ < total ("grow").
    The optimum is therefore unique only when no shrink/grow is needed; among the many optima this
    function returns:

    - ``method="euclidean"`` (default): the Euclidean projection of ỹ⁺ onto the simplex. It is in
      the optimal set (shrinking is ``max(ỹ⁺ − θ, 0)``, growing is ``ỹ⁺ + θ`` on allowed cells) and
      is the minimum-L2 optimum. Shrinking by a common threshold removes the upward bias that
      clipping adds to empty cells (pure noise), instead of scaling down large true cells.
    - ``method="proportional"``: ``ỹ⁺ · total / Σỹ⁺`` — also in the optimal set (all coordinates
      move in one direction), and the optimum of least relative entropy to ỹ⁺ (it is the
      global KL projection of ỹ⁺ onto the simplex). Empty cells stay empty.

    When ``Σỹ⁺ = 0`` and mass must be added, every y in the simplex is optimal; the mass is then
    spread like ``fallback`` (e.g. the current model's answers) or uniformly over allowed cells.
    """
    y = np.asarray(y_noisy, dtype=np.float64)
    ok = np.ones(y.shape, bool) if allowed is None else np.asarray(allowed, bool)
    x = np.where(ok, np.maximum(y, 0.0), 0.0)
    s: float = x.sum()
    if partial and s <= total:
        return x
    if not ok.any():
        if total > 0 and not partial:
            raise ValueError("no allowed cell can carry the required mass")
        return x
    if s > total:  # shrink
        if method == "proportional":
            return x * (total / s)
        return _shrink_threshold(x, total)
    # grow (not partial)
    if s <= 0.0:
        if fallback is not None:
            f = np.where(ok, np.maximum(np.asarray(fallback, dtype=np.float64), 0.0), 0.0)
            f_total: float = f.sum()
            if f_total > 0:
                return f * (total / f_total)
        n_ok: int = ok.sum()
        return ok * (total / n_ok)
    if method == "proportional":
        return x * (total / s)
    n_allowed: int = ok.sum()
    return x + ok * ((total - s) / n_allowed)


def _shrink_threshold(x: np.ndarray, total: float) -> np.ndarray:
    """max(x − θ, 0) with θ ≥ 0 such that the sum is ``total`` (x ≥ 0, Σx > total ≥ 0)."""
    if total <= 0:
        return np.zeros_like(x)
    v = np.sort(x[x > 0])[::-1]
    css = np.cumsum(v)
    k = np.arange(1, v.size + 1)
    theta_k = (css - total) / k
    theta: float = theta_k[np.flatnonzero(v - theta_k > 0)[-1]]
    return np.maximum(x - theta, 0.0)


# ============================================================ Definition 3.1 (closed-form update)
_TINY_MASS = 1e-280


def least_relative_entropy_update(p: np.ndarray, cells: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Tao et al. Definition 3.1: f(p; W_s, y_s), the least-relative-entropy distribution with
    ``W_s q = y_s`` for a partial workload of disjoint rows (Theorem 3.1).

    ``p``: the current distribution over the N domain points (here: support households), Σp = 1.
    ``cells``: the row of W_s covering each point, −1 where no row covers it (a partial workload).
    ``y``: the optimal answers y_s (y ≥ 0, Σy ≤ 1; Σy = 1 when every point is covered).

    The four cases (the paper's ``y_s[j]`` in cases 1–2 is the answer of the row i covering j):
      1. covered by row i with ``W_s[i]ᵀp > 0``:  ``p_j · y_i / W_s[i]ᵀp``;
      2. covered by row i with ``W_s[i]ᵀp = 0``:  ``y_i / ||W_s[i]||₁`` (spread evenly on the row);
      3. uncovered, uncovered mass ``1 − ||W_s p||₁ > 0``: ``p_j (1 − ||y||₁) / (1 − ||W_s p||₁)``;
      4. uncovered, uncovered mass 0: ``(1 − ||y||₁) / (N − ||W_s||₁,₁)``.
    The uncovered mass is summed directly over uncovered points (equal to 1 − ||W_s p||₁ when
    Σp = 1, and exactly zero when it should be).
    """
    p = np.asarray(p, dtype=np.float64)
    cells = np.asarray(cells, dtype=np.int64)
    y = np.asarray(y, dtype=np.float64)
    n_cells = y.size
    cov = cells >= 0
    cc = cells[cov]
    mass = np.bincount(cc, weights=p[cov], minlength=n_cells)
    count = np.bincount(cc, minlength=n_cells)
    if np.any((count == 0) & (y > 0)):
        raise ValueError("a row with no domain point has a positive answer; project with `allowed`")
    # A row whose mass underflowed to a subnormal number is treated as empty (case 2): y / mass
    # would overflow to inf and turn the distribution into NaN.
    live = mass > _TINY_MASS
    factor = np.where(live, y / np.where(live, mass, 1.0), 0.0)                  # case 1
    even = np.where(~live & (count > 0), y / np.maximum(count, 1), 0.0)          # case 2
    q = np.empty_like(p)
    q[cov] = np.where(live[cc], p[cov] * factor[cc], even[cc])
    unc = ~cov
    if unc.any():
        rest = max(1.0 - float(y.sum()), 0.0)
        pm = float(p[unc].sum())
        q[unc] = p[unc] * (rest / pm) if pm > 0 else rest / int(unc.sum())       # cases 3, 4
    elif y.sum() < 1.0 - 1e-9:
        raise ValueError("the workload covers every point, so its answers must sum to 1 (Alg. 1 line 7)")
    return q


# ===================================================== non-partition workloads: stage 1 (L1 to hull)
def project_to_hull_l1(
    patterns: sp.csr_matrix,
    y_noisy: np.ndarray,
    reference: np.ndarray | None = None,
    *,
    tie_tol: float = 1e-9,
) -> tuple[np.ndarray, float]:
    """Tao et al. §3.1–3.2 stage 1 on the support: ``y* = argmin_y ||y − ỹ||₁`` over
    ``y = Pᵀz, z ≥ 0, Σz = 1`` where the rows of ``patterns`` P (U × cells) are the distinct
    incidence columns of the (currently reachable) support households.

    Solved as a linear program (HiGHS) with slack e ≥ |Pᵀz − ỹ|. The optimal set is generally not a
    single point, so when ``reference`` (the current model answers) is given a second LP picks,
    among the L1-optimal answers (``Σe ≤ L* + tie_tol``), the one closest in L1 to the reference —
    the feasible answers that change the current estimate least, in the spirit of the minimum
    relative-entropy principle. Returns (y*, L*) with y* = Pᵀz computed from the LP's z, hence
    exactly producible by a distribution on the support.
    """
    P = sp.csr_matrix(patterns, dtype=np.float64)
    U, C = P.shape
    y = np.asarray(y_noisy, dtype=np.float64)
    Pt = P.T.tocsr()
    I = sp.identity(C, format="csr")
    A_ub = sp.vstack([sp.hstack([Pt, -I]), sp.hstack([-Pt, -I])]).tocsr()
    b_ub = np.concatenate([y, -y])
    A_eq = sp.csr_matrix(np.concatenate([np.ones(U), np.zeros(C)])[None, :])
    c = np.concatenate([np.zeros(U), np.ones(C)])
    res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=[1.0], bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"L1 projection LP failed: {res.message}")
    L = float(res.fun)
    z = res.x[:U]
    if reference is not None:
        r = np.asarray(reference, dtype=np.float64)
        Z = sp.csr_matrix((C, C))
        A2 = sp.vstack(
            [
                sp.hstack([Pt, -I, Z]),
                sp.hstack([-Pt, -I, Z]),
                sp.hstack([Pt, Z, -I]),
                sp.hstack([-Pt, Z, -I]),
                sp.csr_matrix(np.concatenate([np.zeros(U), np.ones(C), np.zeros(C)])[None, :]),
            ]
        ).tocsr()
        b2 = np.concatenate([y, -y, r, -r, [L + tie_tol * max(1.0, L)]])
        A_eq2 = sp.csr_matrix(np.concatenate([np.ones(U), np.zeros(2 * C)])[None, :])
        c2 = np.concatenate([np.zeros(U + C), np.ones(C)])
        res2 = linprog(c2, A_ub=A2, b_ub=b2, A_eq=A_eq2, b_eq=[1.0], bounds=(0, None), method="highs")
        if res2.status == 0:
            z = res2.x[:U]
    z = np.maximum(z, 0.0)
    z /= z.sum()
    return Pt @ z, L


# ===================================================== non-partition workloads: stage 2 (I-projection)
@dataclass
class ProjectionInfo:
    iterations: int
    residual_l1: float
    converged: bool
    lam: np.ndarray


def entropy_projection(
    q: np.ndarray,
    patterns: Patterns,
    y_target: np.ndarray,
    *,
    interior: float | None = None,
    tol: float = 1e-10,
    max_iter: int = 100,
    lam0: np.ndarray | None = None,
    exact_iter: int = 20,
) -> tuple[np.ndarray, ProjectionInfo]:
    """The I-projection ``argmin_z KL(z ‖ q) s.t. A z = y, Σz = 1`` on the support (Tao et al. §3.1,
    eq. (2), with p := q, the current distribution, as in each step of Algorithm 1).

    By eq. (3) the solution is ``z_h = q_h exp(λᵀ A[:, h]) / Z(λ)``, constant in λ across households
    sharing an incidence column, so it is solved on the U patterns: λ minimises the smooth convex dual
    ``g(λ) = log Σ_u m_u exp(λᵀ a_u) − λᵀ y`` (m_u = pattern mass, a_u = pattern column), whose
    gradient is ``E_z[a] − y`` and Hessian ``Cov_z(a)``; damped Newton with Armijo backtracking.

    ``y_target`` must be producible by a distribution on the reachable support ({h : q_h > 0}),
    e.g. the output of :func:`project_to_hull_l1`. If it lies on the boundary of that set the dual
    has no finite minimiser (some households must get weight 0), so the target is moved a fraction
    ``interior`` of the way towards the current answers ``A q`` (a point of the relative interior):
    the answers change by at most ``interior · ||y − Aq||₁`` and the dual becomes well posed.
    ``interior=None`` (default) first tries the exact target (``exact_iter`` Newton iterations —
    enough when the target is interior, e.g. noiseless answers) and only if that does not converge
    continues, warm-started, with ``interior = 1e-3``.

    ``lam0`` (cells,) warm-starts λ (the dual is convex, so any start gives the same solution); the
    final λ is returned in ``info.lam`` — in the sweeps of :func:`engine.synthesis._prior_update.prior_update` the multipliers of one
    workload change little from sweep to sweep, so warm starts cut Newton iterations to a few.
    """
    if interior is None:
        z, info = _entropy_newton(q, patterns, y_target, 0.0, tol, min(exact_iter, max_iter), lam0)
        if info.converged:
            return z, info
        z, info2 = _entropy_newton(q, patterns, y_target, 1e-3, tol, max_iter, info.lam)
        info2.iterations += info.iterations
        return z, info2
    return _entropy_newton(q, patterns, y_target, interior, tol, max_iter, lam0)


def _entropy_newton(q: np.ndarray, patterns: Patterns, y_target: np.ndarray, interior: float, tol: float, max_iter: int,
                    lam0: np.ndarray | None) -> tuple[np.ndarray, ProjectionInfo]:
    q = np.asarray(q, dtype=np.float64)
    m = patterns.mass(q)
    total = m.sum()
    m = m / total
    P = patterns.matrix
    Pt = patterns.transposed
    n_cells = P.shape[1]
    active = m > _TINY_MASS  # underflowed (subnormal) masses are dropped: π/m would overflow
    m = np.where(active, m, 0.0)
    current = Pt @ m
    y = (1.0 - interior) * np.asarray(y_target, dtype=np.float64) + interior * current
    # cells that some reachable pattern touches (the others have y = 0 and no multiplier)
    used = np.flatnonzero(Pt @ active.astype(np.float64) > 0)
    if used.size == 0:
        return q / total, ProjectionInfo(0, float(np.abs(y).sum()), False, np.zeros(n_cells))
    pu, pcell, pval = patterns.second_moment_pairs()
    with np.errstate(divide="ignore"):
        logm = np.log(m)
    lam = np.zeros(n_cells)
    if lam0 is not None:
        lam[used] = np.asarray(lam0, dtype=np.float64)[used]
    yu = y[used]

    def dual(l: np.ndarray) -> tuple[float, np.ndarray]:
        s = logm + P @ l
        smax = s[active].max()
        e = np.exp(s - smax)
        Z = e.sum()
        return smax + math.log(Z) - float(l[used] @ yu), e / Z

    f, pi = dual(lam)
    if lam0 is not None:
        f_cold, pi_cold = dual(np.zeros(n_cells))
        if not f <= f_cold:  # a warm start that is worse than λ = 0 (or not finite) is dropped
            lam, f, pi = np.zeros(n_cells), f_cold, pi_cold
    it = 0
    resid = np.inf
    d = np.zeros(n_cells)
    for it in range(1, max_iter + 1):  # noqa: B007 - `it` is read after the loop (the iterations taken), so it cannot be `_`
        mean = (Pt @ pi)[used]
        g = mean - yu
        resid = float(np.abs(g).sum())
        if resid <= tol:
            break
        second = np.bincount(pcell, weights=pi[pu] * pval, minlength=n_cells * n_cells).reshape(n_cells, n_cells)
        H = second[np.ix_(used, used)] - np.outer(mean, mean)
        # Levenberg–Marquardt damping: keeps λ from drifting along directions that do not change
        # z (e.g. a row set whose sum is constant on the support), which are free in the dual.
        H[np.diag_indices_from(H)] += 1e-9 * np.trace(H) / H.shape[0] + 1e-300
        try:
            du = cho_solve(cho_factor(H, check_finite=False), -g, check_finite=False)
        except np.linalg.LinAlgError:
            du = np.linalg.lstsq(H, -g, rcond=None)[0]
        slope = float(g @ du)
        if not slope < 0:  # numerical trouble: fall back to a gradient step
            du, slope = -g, -float(g @ g)
        d[:] = 0.0
        d[used] = du
        t = 1.0
        for _ in range(60):
            f_new, pi_new = dual(lam + t * d)
            if f_new <= f + 1e-4 * t * slope:
                break
            t *= 0.5
        else:
            break
        lam, f, pi = lam + t * d, f_new, pi_new
    else:
        resid = float(np.abs((Pt @ pi)[used] - yu).sum())
    factor = np.where(active, pi / np.where(active, m, 1.0), 0.0)
    z = q / total * factor[patterns.pattern_of]
    return z, ProjectionInfo(it, resid, resid <= max(tol, 1e-7), lam)


def kl_divergence(q: np.ndarray, p: np.ndarray) -> float:
    """KL(q ‖ p) in nats (Tao et al. Definition 2.2); inf when q puts mass where p has none."""
    q = np.asarray(q, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    q = q / q.sum()
    p = p / p.sum()
    nz = q > 0
    if np.any(p[nz] <= 0):
        return math.inf
    return float(np.sum(q[nz] * np.log(q[nz] / p[nz])))
