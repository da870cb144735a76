"""Prior-aware distribution estimation on a support of public households.

Implements, on the weighted support of :mod:`engine.support` (the distribution q is a weight vector
over whole public households, Tao et al. §3.2 / PMW-Pub §3.2):

1. **Tao, Bater, Machanavajjhala — "Prior-Aware Distribution Estimation for Differential Privacy"**
   - :func:`project_simplex_l1` — Algorithm 1 lines 6–10, the L1-optimal feasible answers
     ``y_s = argmin ||y − ỹ_s||₁  s.t. y ≥ 0, Σy = 1`` (or ``Σy ≤ 1`` for a partial workload);
   - :func:`least_relative_entropy_update` — Definition 3.1 (all four cases), the closed form of
     ``argmin_q KL(q ‖ p) s.t. W_s q = y_s`` for a partial workload whose rows are disjoint
     (‖W_s‖₁ = 1, Theorem 3.1);
   - :func:`prior_update` — Algorithm 1 (IDE) as T sweeps over the measured workloads, the
     per-node step PRIOR_UPDATE of Algorithm 2 (state level, then every PUMA from the state's
     posterior).
2. For workloads that are **not** partitions of the households (group-level "contains" queries and
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
3. **Liu, Vietri, Steinke, Ullman, Wu — PMW-Pub** (:func:`pmw_pub`): adaptive rounds of
   permute-and-flip selection of the worst workload, a Gaussian measurement, and the multiplicative
   weights update over the public support, replaying past measurements (their §4.3). Selection and
   measurement are callables so that the pipeline routes them through the privacy ledger.

Scale convention: every answer handled here is **per household of the node**: a noisy count
vector divided by the (noisy or public) number of households Ñ_G of the node (Alg. 2 line 5,
:func:`normalise_counts`). For a group-level workload this is the usual proportion; for a
person-level workload it is persons-per-household in each cell, which is linear in the household
distribution q (the person-normalised H-GEM answer, counts / N_I, is not linear in q).

Finally :func:`sample_households` draws the synthetic households from the posterior, optionally with
exactly the household-size counts fixed by the count-of-counts stage.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import scipy.sparse as sp
from scipy.linalg import cho_factor, cho_solve
from scipy.optimize import linprog

from engine.hierarchical_data import HierarchicalData
from engine.queries import Patterns, Workload
from engine.support import Support

SimplexMethod = Literal["euclidean", "proportional"]


# ===================================================================================== totals
def noisy_total_to_count(noisy_total: float) -> int:
    """Tao et al. Alg. 2 line 3: ñ = ⌊max(ñ, 0)⌋ (a noisy count made a usable number of households)."""
    return int(math.floor(max(float(noisy_total), 0.0)))


def normalise_counts(noisy_counts: np.ndarray, total: float) -> np.ndarray:
    """Tao et al. Alg. 2 line 5: ỹ = ỹ_counts / ñ, with ñ a noisy or public household total.

    Person-level counts are divided by the household total too (persons per household, see the
    module docstring). A total below 1 is treated as 1 (an empty node gives answers ≈ 0).
    """
    return np.asarray(noisy_counts, dtype=np.float64) / max(float(total), 1.0)


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
    s = x.sum()
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
            if f.sum() > 0:
                return f * (total / f.sum())
        return ok * (total / ok.sum())
    if method == "proportional":
        return x * (total / s)
    return x + ok * ((total - s) / ok.sum())


def _shrink_threshold(x: np.ndarray, total: float) -> np.ndarray:
    """max(x − θ, 0) with θ ≥ 0 such that the sum is ``total`` (x ≥ 0, Σx > total ≥ 0)."""
    if total <= 0:
        return np.zeros_like(x)
    v = np.sort(x[x > 0])[::-1]
    css = np.cumsum(v)
    k = np.arange(1, v.size + 1)
    theta_k = (css - total) / k
    rho = np.flatnonzero(v - theta_k > 0)[-1]
    return np.maximum(x - theta_k[rho], 0.0)


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
    final λ is returned in ``info.lam`` — in the sweeps of :func:`prior_update` the multipliers of one
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


def _entropy_newton(q, patterns: Patterns, y_target, interior: float, tol: float, max_iter: int, lam0):
    q = np.asarray(q, dtype=np.float64)
    m = patterns.mass(q)
    total = m.sum()
    m = m / total
    P = patterns.matrix
    Pt = patterns._memo.get("T")
    if Pt is None:
        Pt = patterns._memo["T"] = P.T.tocsr()
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

    def dual(l: np.ndarray):
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
@dataclass(frozen=True)
class Measurement:
    """A measured workload at one node: ``answer`` is per household (noisy counts / Ñ_G)."""

    workload: Workload
    answer: np.ndarray


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


@dataclass
class PriorUpdateResult:
    weights: np.ndarray
    targets: dict[str, np.ndarray]
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0

    def diagnostics(self) -> dict:
        """JSON-serialisable convergence record (for the run's internal logs)."""
        return {"sweeps": self.history, "seconds": self.seconds}


class _Target:
    """Per-measurement state: the feasible answers y* and how to apply the update."""

    def __init__(
        self, support: Support, m: Measurement, p0: np.ndarray, simplex_method: SimplexMethod, tie_break: bool
    ):
        self.w = m.workload
        self.noisy = np.asarray(m.answer, dtype=np.float64)
        n_cells = self.w.n_cells(support.data.domain)
        if self.noisy.shape != (n_cells,):
            raise ValueError(f"{self.w.id}: answer has shape {self.noisy.shape}, expected ({n_cells},)")
        self.A = support.incidence(self.w)
        self.partition = self.w.is_partition()
        self.newton_iterations = 0
        self.unconverged = 0
        if self.partition:
            self.cells = support.cache.partition_cells(self.w)
            allowed = np.bincount(self.cells, minlength=n_cells) > 0
            # Alg. 1 line 7: a partition of the support covers every point: Σy = 1.
            self.y = project_simplex_l1(self.noisy, allowed=allowed, method=simplex_method)
            return
        # Stage 1 once per node, on the support reachable from the prior (p0 > 0).
        self.patterns = support.patterns(self.w)
        self.reachable = self.patterns.mass(p0) > 0
        P = self.patterns.matrix[np.flatnonzero(self.reachable)]
        self.y, self.l1_optimal = project_to_hull_l1(P, self.noisy, reference=(self.A @ p0) if tie_break else None)
        self.p0 = p0
        self.lam: np.ndarray | None = None  # the last dual solution, warm-starts the next projection

    def apply(self, q: np.ndarray, newton_tol: float, newton_max_iter: int, revive: float) -> np.ndarray:
        if self.partition:
            return least_relative_entropy_update(q, self.cells, self.y)
        if np.any(self.reachable & (self.patterns.mass(q) <= 0)):
            # Some households reachable from the prior lost all their mass in an earlier partition
            # update (a cell answered 0), so y* may no longer be producible from q. As in Def. 3.1
            # case 2 (mass for a row of zero prior mass is spread over its domain points), the
            # reference measure gets back a vanishing share of the prior: q + revive · p0.
            q = q + revive * self.p0
            q /= q.sum()
        # A noisy answer outside the producible set (L* > 0) projects onto the boundary of that
        # set, where the dual has no finite minimiser: use the interior shift at once. An answer
        # inside it (L* = 0, e.g. noiseless) is first matched exactly.
        interior = 1e-3 if self.l1_optimal > 1e-12 else None
        z, info = entropy_projection(
            q, self.patterns, self.y, interior=interior, tol=newton_tol, max_iter=newton_max_iter, lam0=self.lam
        )
        self.lam = info.lam
        self.newton_iterations += info.iterations
        self.unconverged += not info.converged
        return z


def prior_update(
    support: Support,
    measurements: Sequence[Measurement],
    *,
    prior: np.ndarray | None = None,
    T: int = 10,
    order: Literal["cyclic", "random"] = "cyclic",
    rng: np.random.Generator | None = None,
    simplex_method: SimplexMethod = "euclidean",
    tol: float = 1e-6,
    newton_tol: float = 1e-9,
    newton_max_iter: int = 30,
    tie_break: bool = True,
    revive: float = 1e-9,
) -> PriorUpdateResult:
    """Tao et al. Algorithm 1 (IDE) on a support of public households; PRIOR_UPDATE of Algorithm 2.

    Starting from ``prior`` (default: ``support.weights``), each of ``T`` sweeps visits every
    measurement once (``order="cyclic"`` in the given order, ``"random"`` in a fresh random order per
    sweep — Alg. 1 line 4 draws the partial workload at random) and replaces q by the
    least-relative-entropy distribution matching that workload's feasible answers:
    - partition workloads (group level, S_I = ∅): y* by :func:`project_simplex_l1` (lines 6–10) and
      the closed form of Definition 3.1 (line 11);
    - other workloads: y* by :func:`project_to_hull_l1` and the I-projection
      :func:`entropy_projection` (the same two-stage problem, solved numerically).
    T sweeps are T·|W| iterations of Alg. 1 (the paper used 2|W| iterations, i.e. T = 2).

    Returns the posterior weights (a distribution on the support) with a per-sweep history:
    L1 workload error against the noisy answers (``l1_noisy``, summed over workloads) and against the
    feasible answers (``l1_feasible``, → 0 when the feasible answers are jointly consistent),
    the largest per-workload feasible error, and KL(q ‖ prior). Stops early when that largest
    error falls below ``tol``.
    """
    t0 = time.perf_counter()
    if prior is None:
        prior = support.weights
    p0 = np.asarray(prior, dtype=np.float64)
    if p0.shape != (support.n_support,) or p0.sum() <= 0:
        raise ValueError("prior must be a non-negative vector over the support with positive mass")
    q = p0 / p0.sum()
    p0 = q.copy()
    targets = [_Target(support, m, p0, simplex_method, tie_break) for m in measurements]
    rng = rng if rng is not None else np.random.default_rng(0)
    history: list[dict] = []
    for sweep in range(1, T + 1):
        idx = np.arange(len(targets)) if order == "cyclic" else rng.permutation(len(targets))
        for i in idx:
            q = targets[i].apply(q, newton_tol, newton_max_iter, revive)
            q /= q.sum()
        errs_noisy, errs_feasible = [], []
        for tg in targets:
            a = tg.A @ q
            errs_noisy.append(float(np.abs(a - tg.noisy).sum()))
            errs_feasible.append(float(np.abs(a - tg.y).sum()))
        history.append(
            {
                "sweep": sweep,
                "l1_noisy": float(sum(errs_noisy)),
                "l1_feasible": float(sum(errs_feasible)),
                "max_l1_feasible": float(max(errs_feasible, default=0.0)),
                "kl_to_prior": kl_divergence(q, p0),
            }
        )
        if history[-1]["max_l1_feasible"] < tol:
            break
    return PriorUpdateResult(
        weights=q,
        targets={tg.w.id: tg.y for tg in targets},
        history=history,
        seconds=time.perf_counter() - t0,
    )


# ================================================================================= PMW-Pub
@dataclass
class PMWPubResult:
    weights: np.ndarray            # the output distribution (average of the iterates, PMW-Pub Alg. 1)
    last: np.ndarray               # the last iterate A_T
    selected: list[str]            # workload ids in selection order
    measurements: list[Measurement]
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
    ``total`` vs the exact private counts ``true_counts``, divided by the workload's household-unit L1
    sensitivity so every score has sensitivity 1); ``select(scores, 1.0)`` (permute-and-flip through
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
    sens = np.array([w.sensitivity(d, "household")[0] for w in workloads])
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
        measurements=[Measurement(workloads[i], y) for i, y in measured],
        history=history,
    )


# ================================================================================= sampling
def _draw(p: np.ndarray, n: int, rng: np.random.Generator, method: str) -> np.ndarray:
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    if method == "systematic":
        u = (rng.random() + np.arange(n)) / n
    elif method == "multinomial":
        u = rng.random(n)
    else:
        raise ValueError(f"unknown sampling method {method!r}")
    return np.minimum(np.searchsorted(cdf, u, side="right"), p.size - 1).astype(np.int64)


def household_order(data: HierarchicalData) -> np.ndarray:
    """The support's households sorted by their group attributes (the domain's first group
    attribute — the household size — slowest, then the next …; ties keep the support order).
    Systematic sampling along this order is implicitly stratified: every run of households that
    share their leading attributes receives its expected number of draws to within one, so the
    sample's household-attribute marginals carry almost no sampling error."""
    if data.group.shape[1] == 0:
        return np.arange(data.n_households, dtype=np.int64)
    return np.lexsort(data.group.T[::-1]).astype(np.int64)


def sample_households(
    support: Support | HierarchicalData,
    weights: np.ndarray | None,
    n: int | None,
    rng: np.random.Generator,
    sizes: Sequence[int] | np.ndarray | None = None,
    *,
    method: Literal["systematic", "multinomial"] = "systematic",
    geo: Sequence[int] | None = None,
    order: np.ndarray | None = None,
) -> HierarchicalData:
    """Draw ``n`` synthetic households (with their persons) from the posterior on the support
    (Tao et al. Alg. 2 line 16: "sample ñ_g tuples from p_g").

    ``sizes``: optional counts of households of each size 1..M (``sizes[k]`` of size k+1, e.g. from
    the count-of-counts stage). Then exactly that many households of each size are drawn from the
    posterior conditioned on NP = k+1; if the posterior has no mass on a size that must appear, the
    households of that size in the support are used uniformly (the public empirical conditional);
    a size absent from the support altogether is an error.

    ``method="systematic"`` (default): systematic resampling — every household appears
    ⌊n q_h⌋ or ⌈n q_h⌉ times, unbiased, far less sampling noise than i.i.d. draws;
    ``"multinomial"``: i.i.d. draws. Output order is shuffled. ``geo``: optional full geography
    row written into every sampled household (otherwise the public households' own codes are kept).
    ``order``: a permutation of the support along which the systematic draw walks (e.g.
    :func:`household_order`, which stratifies the sample on the household attributes); default the
    support order.
    """
    data = support.data if isinstance(support, Support) else support
    if weights is None:
        if not isinstance(support, Support):
            raise ValueError("weights are required with a HierarchicalData support")
        weights = support.weights
    p = np.asarray(weights, dtype=np.float64)
    if p.shape != (data.n_households,) or np.any(p < 0):
        raise ValueError("weights must be non-negative, one per support household")
    if sizes is None:
        if n is None:
            raise ValueError("give n or sizes")
        if p.sum() <= 0:
            raise ValueError("weights have no mass")
        if order is None:
            idx = _draw(p, int(n), rng, method)
        else:
            order = np.asarray(order, dtype=np.int64)
            if order.shape != p.shape or np.any(np.bincount(order, minlength=p.size) != 1):
                raise ValueError("order must be a permutation of the support's households")
            idx = order[_draw(p[order], int(n), rng, method)]
    else:
        sizes = np.asarray(sizes, dtype=np.int64)
        M = data.domain.max_size
        if sizes.shape != (M,) or np.any(sizes < 0):
            raise ValueError(f"sizes must hold {M} non-negative counts (sizes 1..{M})")
        if n is not None and int(n) != int(sizes.sum()):
            raise ValueError(f"n = {n} but the size counts add up to {int(sizes.sum())}")
        hs = data.sizes
        parts = []
        for k in np.flatnonzero(sizes):
            members = np.flatnonzero(hs == k + 1)
            if members.size == 0:
                raise ValueError(f"no household of size {k + 1} in the support")
            pk = p[members]
            if pk.sum() <= 0:
                pk = np.ones(members.size)
            parts.append(members[_draw(pk, int(sizes[k]), rng, method)])
        idx = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    idx = idx[rng.permutation(idx.size)]
    out = data.take(idx)
    if geo is not None:
        row = np.asarray(geo, dtype=np.int32).reshape(1, -1)
        out = out.with_geo(np.repeat(row, out.n_households, axis=0))
    return out
