"""A measurement: the noisy answer of one workload at one geography node.

The one type the synthesis (:mod:`engine.synthesis._node`), the prior updates (:mod:`engine.synthesis._map_update`,
:mod:`engine.synthesis._prior_update`) and the count-of-counts size marginal hand around: the noisy counts
(households, or persons, of the node in each cell of the workload), the standard deviation σ of
one cell's noise in the same units, and the ρ-zCDP it cost. Measurements come from a measure
callable (:data:`engine.synthesis._node.MeasureFn`: the pipeline's charges the private session and
persists a :class:`~engine.privacy._measurements.MeasurementRecord`, the provenance record with
key, mechanism, sensitivity and hash; a benchmark's adds local noise).

Scale: the counts are kept as measured. The updates work per household of the node
(:meth:`Measurement.answers`, Tao et al. Alg. 2 line 5: ỹ = ỹ_counts / ñ with ñ the node's
household total), so a count of persons becomes persons per household, which is linear in the
household distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from engine.queries._queries import Workload

__all__ = ["Measurement", "normalise_counts"]


def normalise_counts(noisy_counts: np.ndarray, total: float) -> np.ndarray:
    """Tao et al. Alg. 2 line 5: ỹ = ỹ_counts / ñ, with ñ a noisy or public household total.

    Person-level counts are divided by the household total too (persons per household). A total
    below 1 is treated as 1 (an empty node gives answers ≈ 0).
    """
    return np.asarray(noisy_counts, dtype=np.float64) / max(float(total), 1.0)


@dataclass(frozen=True, eq=False)
class Measurement:
    """``noisy_answer``: noisy counts per cell of ``workload``; ``sigma``: the noise standard
    deviation of one cell, in counts (0: exact, e.g. a noiseless test target); ``rho``: the
    ρ-zCDP spent on it (0 where the caller did not say, e.g. a post-processed estimate)."""

    workload: Workload
    noisy_answer: np.ndarray
    sigma: float
    rho: Fraction = field(default=Fraction(0))

    def __post_init__(self) -> None:
        object.__setattr__(self, "noisy_answer", np.asarray(self.noisy_answer, dtype=np.float64))
        if not self.sigma >= 0:
            raise ValueError(f"{self.workload.id}: noise sigma must be >= 0, got {self.sigma!r}")

    @property
    def variance(self) -> float:
        """Noise variance of one cell, σ² (in counts²)."""
        return float(self.sigma) ** 2

    def answers(self, total: float) -> np.ndarray:
        """The answers per household of the node: counts / ``total`` (:func:`normalise_counts`)."""
        return normalise_counts(self.noisy_answer, total)
