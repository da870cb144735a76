"""Per-node synthesis by prior update (Tao et al., Algorithm 2), shared by the pipeline and the
benchmarks.

PRIOR_UPDATE(W, h, p): measure the node's workloads W on its private households h, normalise by the
node's household total (public, or from the count-of-counts stage), and update the prior p (a
distribution on the support of public households) into the node's posterior. Per state the prior is
the public empirical distribution; per PUMA it is the state's posterior. The measurement is an
injected callable so that the pipeline routes it through the privacy ledger and the measurement
store, and benchmarks can use a local sampler.

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

# measure(workload, exact integer counts, l2_sensitivity, rho) -> (noisy counts, sigma)
MeasureFn = Callable[[Workload, np.ndarray, float, Fraction], tuple[np.ndarray, float]]
UpdateRule = Literal["map", "ide"]


@dataclass
class NodeResult:
    weights: np.ndarray
    diagnostics: dict


def measure_node(private: HierarchicalData, workloads: Sequence[Workload], rho: Fraction, unit: PrivacyUnit, measure: MeasureFn, total: float) -> list[NoisyWorkload]:
    """Measure every workload of a node (even split of ρ) and normalise by the household total."""
    rho_w = Fraction(rho) / len(workloads)
    out = []
    for w in workloads:
        _, l2 = w.sensitivity(private.domain, unit)
        noisy, sigma = measure(w, np.rint(answer(private, w)).astype(np.int64), l2, rho_w)
        out.append(NoisyWorkload(w, normalise_counts(noisy, total), float(sigma)))
    return out


def update_node(support: Support, prior: np.ndarray, measurements: list[NoisyWorkload], total: float, rule: UpdateRule = "map", prior_strength: float = 0.1, sweeps: int = 3) -> NodeResult:
    """Update ``prior`` with the node's measurements. ``prior_strength`` is relative to the node's
    household total (α = prior_strength · total pseudo-households) for the MAP rule."""
    if rule == "map":
        q, diag = map_update(support, prior, measurements, total, prior_strength=max(prior_strength * float(total), 1e-6))
        return NodeResult(q, diag)
    res = prior_update(support, [Measurement(m.workload, m.answer) for m in measurements], prior=prior, T=sweeps)
    return NodeResult(res.weights, res.diagnostics())


def synthesize_node(
    support: Support,
    prior: np.ndarray,
    private: HierarchicalData,
    workloads: Sequence[Workload],
    rho: Fraction,
    unit: PrivacyUnit,
    measure: MeasureFn,
    total: float,
    rule: UpdateRule = "map",
    prior_strength: float = 0.1,
    sweeps: int = 3,
) -> NodeResult:
    """PRIOR_UPDATE of one node: measure, normalise, update. With ρ = 0 or no workloads the prior
    is returned unchanged (nothing is measured)."""
    p = np.asarray(prior, dtype=np.float64)
    if rho <= 0 or not workloads:
        return NodeResult(p / p.sum(), {"measured": 0})
    ms = measure_node(private, workloads, Fraction(rho), unit, measure, total)
    return update_node(support, p, ms, total, rule, prior_strength, sweeps)
