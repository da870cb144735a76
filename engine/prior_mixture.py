"""A prior that can be wrong: the public support widened by relabelled copies of its households,
their weight in the prior read off the node's own measurements.

The support (:mod:`engine.support`) holds only public households, and the MAP prior
(:mod:`engine.map_update`) pulls every interaction the measurements do not pin toward the public
one. Where the private state's population differs from the public states' in one attribute, the
few public households with the private state's common value stand in for all of them, and they
need not be typical of that value in the private state (New Mexico's Hispanic households against
the other shared states': ``benchmarks/results/HISTORY.md``).

:func:`widen` adds, for each listed binary person attribute, a copy of every public household with
that attribute flipped for every person and for the household attributes derived from its
householder — households whose other attributes and structure are public, with the other value.
The node's prior is the mixture

    p_λ = (1 − Σ_k λ_k) · p_public + Σ_k λ_k · p_copies(k)

(each component the public prior laid on its households). :func:`choose_mixture` takes λ as the
least-squares fit of the prior's expected answers G·A p_λ to the node's noisy answers, each
weighted by its precision (method of moments on answers already charged and stored: post-processing,
no privacy cost), within [0, 1]; it keeps λ = 0 (the public support alone, the release as before)
unless the fit improves by at least :data:`engine.prior_strength.MIN_GAIN` in Gaussian log-likelihood. Where the private
state's share matches the public data's, λ stays 0; where the measurements contradict the prior,
they move it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from engine.domain import Domain
from engine.hierarchical_data import HierarchicalData
from engine.measurement import Measurement
from engine.prior_strength import MIN_GAIN
from engine.queries import IncidenceCache
from engine.support import Support

__all__ = ["Flip", "MixtureChoice", "WidenedSupport", "choose_mixture", "flipped", "node_prior", "widen"]



@dataclass(frozen=True)
class Flip:
    """A binary person attribute to flip, with the household attributes derived from its
    householder's value (``derive: householder`` in the domain spec), flipped with it."""

    attribute: str
    householder_attributes: tuple[str, ...] = ()


    def check(self, domain: Domain) -> None:
        """Raise ValueError unless the attribute is a binary person attribute of ``domain`` and
        its householder attributes binary household attributes of it."""
        persons, groups = {a.name: a for a in domain.person}, {a.name: a for a in domain.group}
        if self.attribute not in persons:
            raise ValueError(f"{self.attribute!r} is not a person attribute of the domain "
                             f"(expected one of {sorted(persons)})")
        if persons[self.attribute].size != 2:
            raise ValueError(f"person attribute {self.attribute} has {persons[self.attribute].size} values; "
                             "only a binary attribute can be flipped")
        for name in self.householder_attributes:
            if name not in groups or groups[name].size != 2:
                raise ValueError(f"household attribute {name} (derived from {self.attribute}) "
                                 "must be a binary household attribute of the domain")


def flipped(data: HierarchicalData, flip: Flip) -> HierarchicalData:
    """``data`` with ``flip.attribute`` (binary) flipped for every person, and its householder
    attributes (binary) with it; every other value and the household structure unchanged."""
    d = data.domain
    flip.check(d)
    person, group = data.person.copy(), data.group.copy()
    j = d.person_index(flip.attribute)
    person[:, j] = 1 - person[:, j]
    for name in flip.householder_attributes:
        k = d.group_index(name)
        group[:, k] = 1 - group[:, k]
    return HierarchicalData.from_arrays(d, data.geo, group, person, data.person_offsets)


@dataclass(frozen=True, eq=False)
class WidenedSupport:
    """The public households followed by one flipped copy of them per :class:`Flip`, in that
    order: ``support`` (its weights: the public prior on the public households, 0 on the copies)
    and ``flips``."""

    support: Support
    flips: tuple[Flip, ...]

    @property
    def n_public(self) -> int:
        """The number of public households (each block's size)."""
        return self.support.n_support // (len(self.flips) + 1)

    def prior(self, public_prior: np.ndarray, weights: Sequence[float] | np.ndarray) -> np.ndarray:
        """The mixture p_λ (module docstring) of ``public_prior`` (over the public households)
        with mixture ``weights`` λ_k, one per flip; sums to ``public_prior``'s total."""
        lam = np.asarray(weights, dtype=np.float64)
        if lam.shape != (len(self.flips),) or np.any(lam < 0) or lam.sum() > 1 + 1e-12:
            raise ValueError(f"mixture weights must be {len(self.flips)} non-negative numbers summing to at most 1, got {list(weights)}")
        base = np.asarray(public_prior, dtype=np.float64)
        if base.shape != (self.n_public,):
            raise ValueError(f"the public prior must have {self.n_public} entries, got {base.shape}")
        return np.concatenate([(1.0 - lam.sum()) * base, *(l * base for l in lam)])


def widen(public: HierarchicalData, flips: Sequence[Flip], public_prior: np.ndarray | None = None,
          public_cache: IncidenceCache | None = None) -> WidenedSupport:
    """The public households and one flipped copy of them per flip (:class:`WidenedSupport`);
    ``public_prior``: the public households' prior weights (uniform when None); ``public_cache``:
    the public support's incidence cache, from which the widened support takes the incidences and
    patterns of every workload that reads no flipped attribute (a copy's column equals its public
    household's there), so that they are built once for both supports."""
    if not flips:
        raise ValueError("widen needs at least one flip")
    names = [f.attribute for f in flips]
    if len(set(names)) != len(names):
        raise ValueError(f"prior flips name an attribute twice: {names}")
    if public_cache is not None and public_cache.data is not public:
        raise ValueError("public_cache belongs to other households than the public ones")
    data = HierarchicalData.concat([public, *(flipped(public, f) for f in flips)])
    base = Support.from_data(public, public_prior).weights
    weights = np.concatenate([base, np.zeros(public.n_households * len(flips))])
    varied = frozenset(name for f in flips for name in (f.attribute, *f.householder_attributes))
    cache = IncidenceCache(data, (IncidenceCache(public) if public_cache is None else public_cache, varied))
    return WidenedSupport(Support(data, weights, cache), tuple(flips))


@dataclass(frozen=True)
class MixtureChoice:
    """The mixture ``weights`` λ (one per flip of ``attributes``), the fitted λ before the gain
    rule (``fitted``), and the weighted residual sums of squares of the prior's expected answers at
    λ = 0 and at the fit (``rss``): the copies enter the prior (``widened``) only when the fit
    gains at least :data:`MIN_GAIN` in log-likelihood (−½ RSS)."""

    attributes: tuple[str, ...]
    weights: tuple[float, ...]
    fitted: tuple[float, ...]
    rss: tuple[float, float]

    @property
    def widened(self) -> bool:
        return any(w > 0 for w in self.weights)

    def to_dict(self) -> dict[str, Any]:
        return {"attributes": list(self.attributes), "weights": [round(w, 6) for w in self.weights],
                "fitted": [round(w, 6) for w in self.fitted], "rss": [round(r, 3) for r in self.rss], "widened": self.widened}


def choose_mixture(widened: WidenedSupport, public_prior: np.ndarray, measurements: Sequence[Measurement], total: float,
                   min_gain: float = MIN_GAIN) -> MixtureChoice:
    """λ (module docstring) from the noisy answers of ``measurements`` at the node's household
    ``total`` G: minimise Σ_cells ((y − G·A p_λ) / σ)² over λ ≥ 0, Σ λ ≤ 1."""
    ms = [m for m in measurements if m.noisy_answer.size]
    names = tuple(f.attribute for f in widened.flips)
    k = len(widened.flips)
    if not ms:
        return MixtureChoice(names, (0.0,) * k, (0.0,) * k, (0.0, 0.0))
    if any(m.sigma <= 0 for m in ms):
        raise ValueError("the mixture fit needs measurements with positive noise")
    G = max(float(total), 1.0)
    A, pattern_of = widened.support.cache.joint_patterns([m.workload for m in ms])
    comps = [widened.prior(public_prior, np.eye(k)[i - 1] if i else np.zeros(k)) for i in range(k + 1)]
    answers = [A @ np.bincount(pattern_of, weights=c / c.sum(), minlength=A.shape[1]) for c in comps]
    y = np.concatenate([m.noisy_answer for m in ms])
    inv_sd = np.concatenate([np.full(m.noisy_answer.size, 1.0 / m.sigma) for m in ms])
    r = inv_sd * (y - G * answers[0])
    D = np.stack([inv_sd * G * (a - answers[0]) for a in answers[1:]], axis=1)
    lam = np.clip(lsq_linear(D, r, bounds=(0.0, 1.0)).x, 0.0, 1.0)
    if lam.sum() > 1.0:
        lam = lam / lam.sum()
    rss0 = float(r @ r)
    rss1 = float(np.sum((r - D @ lam) ** 2))
    keep = 0.5 * (rss0 - rss1) >= min_gain
    return MixtureChoice(names, tuple(float(x) for x in lam) if keep else (0.0,) * k, tuple(float(x) for x in lam), (rss0, rss1))


def node_prior(public: Support, widened: WidenedSupport | None, measurements: Sequence[Measurement],
               total: float) -> tuple[Support, np.ndarray, MixtureChoice | None]:
    """A state's support and prior: the public support and its weights, or — where
    :func:`choose_mixture` takes the flipped copies in — the widened support with the mixture
    prior; the choice (None without ``widened``)."""
    if widened is None:
        return public, public.weights, None
    choice = choose_mixture(widened, public.weights, measurements, total)
    if choice.widened:
        return widened.support, widened.prior(public.weights, choice.weights), choice
    return public, public.weights, choice
