"""Per-node synthesis by prior update (Tao et al., Algorithm 2), shared by the pipeline and the
benchmarks.

PRIOR_UPDATE(W, h, p): measure the node's workloads W on its private households h, normalise by the
node's household total (a DP estimate from the count-of-counts or household-counts stage, or exact
only under the ``puma_household_counts`` invariant), and update the prior p (a distribution on the
support of public households) into the node's posterior. Per state the prior is the public empirical
distribution; per PUMA it is the state's posterior. The measurement is an injected callable bound to
the node's private households: the pipeline's comes from the private session (charged to the ledger,
persisted in the store), so this module never sees the private data; benchmarks bind a local
sampler.

Two update rules:
- ``"map"`` (default): the noise-aware MAP update of :mod:`engine.map_update` — relative entropy
  to the prior plus the Gaussian likelihood of every measurement, fitted jointly;
- ``"ide"``: Tao et al.'s iterative distribution estimation (:func:`engine.prior_update.prior_update`),
  which matches the (feasible) noisy answers exactly.

Budget inside a node: the node's ρ is split evenly over its workloads; workload w gets
σ_w = Δ₂(w) / √(2 ρ_w) (Gaussian mechanism, ρ = Δ²/(2σ²)).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np

from engine.hierarchical_data import HierarchicalData
from engine.map_update import NoisyWorkload, map_update
from engine.prior_update import Measurement, normalise_counts, prior_update
from engine.queries import PrivacyUnit, Workload, answer
from engine.support import Support

# measure(workload, rho) -> (noisy counts of the node's households, noise sigma per cell)
MeasureFn = Callable[[Workload, Fraction], tuple[np.ndarray, float]]
UpdateRule = Literal["map", "ide"]


@dataclass
class NodeResult:
    weights: np.ndarray
    diagnostics: dict


def measure_node(workloads: Sequence[Workload], rho: Fraction, measure: MeasureFn, total: float) -> list[NoisyWorkload]:
    """Measure every workload of a node (even split of ρ) and normalise by the household total."""
    rho_w = Fraction(rho) / len(workloads)
    out = []
    for w in workloads:
        noisy, sigma = measure(w, rho_w)
        out.append(NoisyWorkload(w, normalise_counts(noisy, total), float(sigma)))
    return out


def local_measure(private: HierarchicalData, unit: PrivacyUnit, noise: Callable[[np.ndarray, float, Fraction], tuple[np.ndarray, float]]) -> MeasureFn:
    """A :data:`MeasureFn` over in-memory data (benchmarks, notebooks): ``noise(counts, l2, rho)``
    adds the noise (e.g. ``engine.privacy.mechanisms.discrete_gaussian``). Nothing is charged: the
    pipeline measures through ``engine.privacy.session.PrivateSession`` instead."""

    def measure(w: Workload, rho: Fraction) -> tuple[np.ndarray, float]:
        return noise(np.rint(answer(private, w)).astype(np.int64), w.sensitivity(private.domain, unit)[1], rho)

    return measure


def update_node(support: Support, prior: np.ndarray, measurements: list[NoisyWorkload], total: float, rule: UpdateRule = "map", prior_strength: float = 0.1, sweeps: int = 3) -> NodeResult:
    """Update ``prior`` with the node's measurements. ``prior_strength`` is relative to the node's
    household total (α = prior_strength · total pseudo-households) for the MAP rule."""
    if rule == "map":
        q, diag = map_update(support, prior, measurements, total, prior_strength=max(prior_strength * float(total), 1e-6))
        return NodeResult(q, diag)
    res = prior_update(support, [Measurement(m.workload, m.answer) for m in measurements], prior=prior, T=sweeps)
    return NodeResult(res.weights, res.diagnostics())


def size_measurement(domain, histogram: Sequence[float], sd: float, total: float) -> NoisyWorkload:
    """The count-of-counts estimate of a node's households of size 1..K as a noisy measurement of
    the size marginal (group workload on the size attribute, code k−1 = size k), normalised by the
    node's household total like every other measurement. ``sd``: noise standard deviation of one
    entry, in households."""
    w = Workload("group", (domain.size_attribute,), ())
    h = np.asarray(histogram, dtype=np.float64)
    if h.size != w.n_cells(domain):
        raise ValueError(f"{h.size} size counts for the {w.n_cells(domain)} codes of {domain.size_attribute}")
    return NoisyWorkload(w, normalise_counts(h, total), float(sd))


def synthesize_node(
    support: Support,
    prior: np.ndarray,
    workloads: Sequence[Workload],
    rho: Fraction,
    measure: MeasureFn | None,
    total: float,
    rule: UpdateRule = "map",
    prior_strength: float = 0.1,
    sweeps: int = 3,
    extra: Sequence[NoisyWorkload] = (),
) -> NodeResult:
    """PRIOR_UPDATE of one node: measure, normalise, update. ``extra``: measurements made
    elsewhere (the count-of-counts size marginal, :func:`size_measurement`) fitted jointly with
    the node's own, each by its precision. With nothing to fit the prior is returned unchanged."""
    p = np.asarray(prior, dtype=np.float64)
    if rho > 0 and workloads and measure is None:
        raise ValueError("workloads to measure at rho > 0 need a measure callable")
    ms = measure_node(workloads, Fraction(rho), measure, total) if rho > 0 and workloads else []
    ms += list(extra)
    if not ms:
        return NodeResult(p / p.sum(), {"measured": 0})
    return update_node(support, p, ms, total, rule, prior_strength, sweeps)
