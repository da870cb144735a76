"""A prior that can be wrong: the public support widened by relabelled copies of its households,
their weight in the prior read off the node's own measurements.

The support (:mod:`engine.queries._support`) holds only public households, and the MAP prior
(:mod:`engine.synthesis._map_update`) pulls every interaction the measurements do not pin toward the public
one. Where the private state's population differs from the public states' in one attribute, the
few public households with the private state's common value stand in for all of them, and they
need not be typical of that value in the private state (New Mexico's Hispanic households against
the other shared states': ``benchmarks/results/HISTORY.md``).

:func:`widen` adds, for each listed relabelling (:class:`Flip`: a binary person attribute flipped, or
two codes of a multi-valued one swapped), copies of the public households it changes with the
attribute relabelled for every person and for the household attributes derived from its
householder — households whose other attributes and structure are public, with the other value.
The node's prior is the mixture

    p_λ = (1 − Σ_k λ_k) · p_public + Σ_k λ_k · p_copies(k)

(each component the public prior laid on its households). A household the relabelling leaves as
it is (neither swapped code among its persons) is its own copy, so its copy's weight stays on it
and the copy is not held: the same mixture on fewer households. Of the changed households, a
share in proportion to λ_k is copied (:func:`copy_share`, :func:`copied`: a copy's prior weight at
most half a public household's), and their copies carry the component's weight in proportion to
the prior: a swap weighed in at a few percent adds a few percent of the households, not all of
them again. :func:`choose_mixture` takes λ as the
least-squares fit of the prior's expected answers G·A p_λ to the node's noisy answers, each
weighted by its precision (method of moments on answers already charged and stored: post-processing,
no privacy cost), within [0, 1]; it keeps λ = 0 (the public support alone, the release as before)
unless the fit improves by at least :data:`engine.synthesis._prior_strength.MIN_GAIN` in Gaussian log-likelihood. Where the private
state's share matches the public data's, λ stays 0; where the measurements contradict the prior,
they move it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear

from engine.data import Domain, HierarchicalData, segment_any
from engine.queries import IncidenceCache, Measurement, Support, Workload
from engine.synthesis._prior_strength import MIN_GAIN

__all__ = ["COPY_DENSITY", "Flip", "MixtureChoice", "WidenedSupport", "changed", "choose_mixture", "choose_swaps", "copied", "copy_share",
           "flipped", "named_flips", "node_prior", "relabelled_cells", "resolve_flips", "shared_within_households", "used_flips", "value_residuals", "widen"]



@dataclass(frozen=True)
class Flip:
    """A relabelling of one person attribute: the codes ``values`` = (a, b) swapped for every
    person of a household, and in the household attributes derived from its householder's value
    (``derive: householder`` in the domain spec; their codes are the attribute's). A binary
    attribute's flip swaps its two codes (``values`` may be left out); a multi-valued attribute's
    ``values`` are chosen where the node's measurements contradict the prior (:func:`choose_swaps`):
    without them the flip is a template."""

    attribute: str
    householder_attributes: tuple[str, ...] = ()
    values: tuple[int, int] | None = None
    share: float = 1.0  # of the households the flip changes, the share whose copies a widened support holds (:func:`copied`)

    def __post_init__(self) -> None:
        if not 0.0 < self.share <= 1.0:
            raise ValueError(f"flip {self.attribute}: share must lie in (0, 1], got {self.share}")

    @property
    def name(self) -> str:
        """The attribute (a binary attribute's flip, or a template) or ``attribute:a:b`` (a swap of
        two named codes, whatever the attribute's size), followed by ``@share`` where only a share
        of the changed households is copied."""
        base = self.attribute if self.values is None else f"{self.attribute}:{self.values[0]}:{self.values[1]}"
        return base if self.share == 1.0 else f"{base}@{self.share!r}"

    def swapping(self, a: int, b: int) -> Flip:
        return Flip(self.attribute, self.householder_attributes, (min(a, b), max(a, b)))

    def sharing(self, share: float) -> Flip:
        return replace(self, share=share)

    def codes(self, domain: Domain) -> tuple[int, int] | None:
        """The two codes swapped: ``values``, (0, 1) for a binary attribute, None for a template."""
        if self.values is not None:
            return self.values
        return (0, 1) if domain.person_attribute(self.attribute).size == 2 else None

    def check(self, domain: Domain) -> None:
        """Raise ValueError unless the attribute is a person attribute of ``domain`` with the two
        ``values`` among its codes, and its householder attributes household attributes of it coded
        like it."""
        persons, groups = {a.name: a for a in domain.person}, {a.name: a for a in domain.group}
        if self.attribute not in persons:
            raise ValueError(f"{self.attribute!r} is not a person attribute of the domain "
                             f"(expected one of {sorted(persons)})")
        size = persons[self.attribute].size
        if self.values is not None and (self.values[0] == self.values[1] or not all(0 <= v < size for v in self.values)):
            raise ValueError(f"{self.attribute} swaps two distinct codes of its {size}, got {self.values}")
        for name in self.householder_attributes:
            if name not in groups or groups[name].codes != persons[self.attribute].codes:
                raise ValueError(f"household attribute {name} (derived from {self.attribute}) "
                                 f"must be a household attribute of the domain coded like {self.attribute}")


def flipped(data: HierarchicalData, flip: Flip) -> HierarchicalData:
    """``data`` with ``flip``'s two codes swapped for every person, and in its householder
    attributes; every other value and the household structure unchanged."""
    d = data.domain
    flip.check(d)
    codes = flip.codes(d)
    if codes is None:
        raise ValueError(f"the flip of multi-valued {flip.attribute} needs the two values to swap")
    a, b = codes
    person, group = data.person.copy(), data.group.copy()

    def swap(column: np.ndarray) -> np.ndarray:
        out = column.copy()
        out[column == a], out[column == b] = b, a
        return out

    j = d.person_index(flip.attribute)
    person[:, j] = swap(person[:, j])
    for name in flip.householder_attributes:
        k = d.group_index(name)
        group[:, k] = swap(group[:, k])
    return HierarchicalData.from_arrays(d, data.geo, group, person, data.person_offsets)


def changed(data: HierarchicalData, flip: Flip) -> np.ndarray:
    """Per household of ``data``: whether ``flip`` changes it (a person, or a householder
    attribute, holds one of its two codes). The copy of any other household is the household."""
    d = data.domain
    codes = flip.codes(d)
    if codes is None:
        raise ValueError(f"the flip of multi-valued {flip.attribute} needs the two values to swap")
    out = segment_any(np.isin(data.person[:, d.person_index(flip.attribute)], codes), data.person_offsets)
    for name in flip.householder_attributes:
        out |= np.isin(data.group[:, d.group_index(name)], codes)
    return out


def copied(data: HierarchicalData, flip: Flip) -> np.ndarray:
    """The households of ``data`` whose relabelled copies a widened support holds for ``flip``
    (ascending): those it changes (:func:`changed`), each kept where a uniform number drawn for it
    lies below the flip's share. The numbers come from a generator seeded by the flip's name
    without its share, so the choice is a function of the public households and the flip alone,
    and a smaller share's copies are among a larger one's."""
    return _held(changed(data, flip), flip)


def _held(hit: np.ndarray, flip: Flip) -> np.ndarray:
    """The households of mask ``hit`` (those ``flip`` changes) whose copies are held (:func:`copied`)."""
    if flip.share < 1.0:
        seed = int.from_bytes(hashlib.sha256(replace(flip, share=1.0).name.encode()).digest()[:8], "little")
        hit = hit & (np.random.default_rng(seed).random(hit.size) < flip.share)
    return np.flatnonzero(hit)


# a copy's prior weight at most 1 / COPY_DENSITY of a public household's: a flip weighed in at λ copies
# (a share of) its changed households in proportion to λ, a few percent of them where λ is a few percent
COPY_DENSITY = 2.0
SHARE_STEP = 64  # shares are multiples of 1 / SHARE_STEP, so that nearby weights name one support


def copy_share(weight: float, weights: Sequence[float]) -> float:
    """The share of a flip's changed households copied (:attr:`Flip.share`) at mixture weight
    ``weight`` among ``weights`` (all the node's): enough that a copy's prior weight is at most
    1 / :data:`COPY_DENSITY` of a public household's, ``weight`` / (1 − Σ weights) per copied share
    against 1 on the public block, rounded up to a multiple of 1 / :data:`SHARE_STEP`."""
    rest = 1.0 - float(np.sum(weights))
    if weight <= 0 or rest <= 0:
        return 1.0
    return min(1.0, float(np.ceil(COPY_DENSITY * weight / rest * SHARE_STEP)) / SHARE_STEP)


def relabelled_cells(workload: Workload, domain: Domain, flip: Flip) -> np.ndarray:
    """For each cell of ``workload``, the cell from which ``flip`` moves households into it: the
    answer of the relabelled households (:func:`flipped`) under any weights is the public answer
    under the same weights taken at these cells. A relabelling changes only which cells a
    household's persons and householder attributes fall in, never the household's contribution
    (its counts, its "contains" ones, its first persons, its normalised rescaling follow its cells),
    and a flip exchanges its two codes, so the map is a permutation along the axes of the attribute
    and its householder attributes (the identity on a workload that reads neither)."""
    codes = flip.codes(domain)
    if codes is None:
        raise ValueError(f"the flip of multi-valued {flip.attribute} needs the two values to swap")
    shape = workload.shape(domain)
    index = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    axes = [i for i, n in enumerate(workload.group_attrs) if n in flip.householder_attributes]
    axes += [len(workload.group_attrs) + i for i, n in enumerate(workload.person_attrs) if n == flip.attribute]
    for axis in axes:
        order = np.arange(shape[axis])
        order[list(codes)] = order[list(codes[::-1])]
        index = np.take(index, order, axis=axis)
    return index.ravel()


SWAP_Z = 3.0  # a code's one-way residual, in standard errors, beyond which the prior is taken to under- or over-represent it
# a multi-valued attribute is relabelled whole households at a time only where its households mostly
# share one value (a household's race, citizenship); where they do not (marital status, education:
# children and parents differ), swapping two codes for every person makes implausible persons
SHARED_WITHIN_HOUSEHOLDS = 0.8


def shared_within_households(data: HierarchicalData, attribute: str) -> float:
    """The share of the multi-person households whose persons all hold one value of ``attribute``
    (1 where there is no multi-person household)."""
    j = data.domain.person_index(attribute)
    starts, sizes = data.person_offsets[:-1], np.diff(data.person_offsets)
    multi = sizes > 1
    if not multi.any():
        return 1.0
    col = data.person[:, j].astype(np.int64)
    lo, hi = np.minimum.reduceat(col, starts), np.maximum.reduceat(col, starts)
    return float(np.mean(lo[multi] == hi[multi]))


def value_residuals(support: Support, prior: np.ndarray, attribute: str, measurements: Sequence[Measurement], total: float) -> np.ndarray:
    """Per code of person ``attribute``: how far the node's noisy answers lie above the prior's
    expected ones, in standard errors — each person-level measurement holding the attribute summed
    onto its codes, combined by inverse variance (post-processing of answers already charged)."""
    d = support.data.domain
    k = d.person_attribute(attribute).size
    num, den = np.zeros(k), np.zeros(k)
    q = np.asarray(prior, dtype=np.float64) / max(float(np.sum(prior)), 1e-300)
    for m in measurements:
        w = m.workload
        if w.level != "person" or attribute not in w.person_attrs or m.sigma <= 0:
            continue
        axis = len(w.group_attrs) + w.person_attrs.index(attribute)
        shape = w.shape(d)
        resid = (np.asarray(m.noisy_answer, dtype=np.float64) - float(total) * support.answer(w, q)).reshape(shape)
        r = resid.sum(axis=tuple(i for i in range(len(shape)) if i != axis))
        var = float(np.prod(shape)) / k * m.sigma ** 2  # the cells summed onto one code, each of variance σ²
        num += r / var
        den += 1.0 / var
    return np.where(den > 0, num / np.sqrt(np.maximum(den, 1e-300)), 0.0)


def choose_swaps(support: Support, templates: Sequence[Flip], measurements: Sequence[Measurement], total: float,
                 z: float = SWAP_Z) -> tuple[Flip, ...]:
    """For each multi-valued template whose values the support's households mostly share
    (:data:`SHARED_WITHIN_HOUSEHOLDS`), the swap of the code the prior most over-represents with
    the one it most under-represents (:func:`value_residuals`), where both lie beyond ``z``
    standard errors; none elsewhere. Which copies then enter the prior, and how much, is the
    mixture's choice (:func:`choose_mixture`)."""
    out = []
    for t in templates:
        if shared_within_households(support.data, t.attribute) < SHARED_WITHIN_HOUSEHOLDS:
            continue
        zs = value_residuals(support, support.weights, t.attribute, measurements, total)
        over, under = int(np.argmin(zs)), int(np.argmax(zs))
        if zs[under] >= z and zs[over] <= -z:
            out.append(t.swapping(over, under))
    return tuple(out)


def named_flips(names: Sequence[str], templates: Sequence[Flip]) -> tuple[Flip, ...]:
    """The flips of the given names (:attr:`Flip.name`, as a state posterior records them), from the
    run's ``templates``."""
    by_attribute = {t.attribute: t for t in templates}
    out = []
    for name in names:
        base, _, share = name.partition("@")
        attribute, *codes = base.split(":")
        if attribute not in by_attribute:
            raise ValueError(f"flip {name!r}: {attribute} is not among the run's prior flips {sorted(by_attribute)}")
        t = by_attribute[attribute]
        f = t.swapping(int(codes[0]), int(codes[1])) if codes else t
        out.append(f.sharing(float(share)) if share else f)
    return tuple(out)


def resolve_flips(templates: Sequence[Flip], support: Support, measurements: Sequence[Measurement], total: float) -> tuple[Flip, ...]:
    """The flips a node's prior mixture weighs: the binary ones as given, and the swaps
    :func:`choose_swaps` finds for the multi-valued templates."""
    d = support.data.domain
    fixed = tuple(f for f in templates if f.codes(d) is not None)
    return fixed + choose_swaps(support, [f for f in templates if f.codes(d) is None], measurements, total)


@dataclass(frozen=True, eq=False)
class WidenedSupport:
    """The ``n_public`` public households followed by one run of flipped copies per :class:`Flip`,
    in that order: ``support`` (its weights: the public prior on the public households, 0 on the
    copies), ``flips``, and per flip the public households it changes (``changed``, a mask) and
    those whose copies the run holds (``copies``, ascending: :func:`copied`)."""

    support: Support
    flips: tuple[Flip, ...]
    n_public: int
    changed: tuple[np.ndarray, ...]
    copies: tuple[np.ndarray, ...]

    def prior(self, public_prior: np.ndarray, weights: Sequence[float] | np.ndarray) -> np.ndarray:
        """The mixture p_λ (module docstring) of ``public_prior`` (over the public households)
        with mixture ``weights`` λ_k, one per flip; sums to ``public_prior``'s total. A household
        the flip leaves unchanged keeps its copy's weight (the copy is the household); the weight
        of the changed ones, λ_k times their prior, is spread over the copies held in proportion
        to their prior."""
        lam = np.asarray(weights, dtype=np.float64)
        if lam.shape != (len(self.flips),) or np.any(lam < 0) or lam.sum() > 1 + 1e-12:
            raise ValueError(f"mixture weights must be {len(self.flips)} non-negative numbers summing to at most 1, got {list(weights)}")
        base = np.asarray(public_prior, dtype=np.float64)
        if base.shape != (self.n_public,):
            raise ValueError(f"the public prior must have {self.n_public} entries, got {base.shape}")
        moved, runs = np.zeros(self.n_public), []
        for l, hit, rows in zip(lam, self.changed, self.copies):
            held, mass = float(base[rows].sum()), float(base[hit].sum())
            if held <= 0:  # no copy to carry the changed households' weight: it stays on them
                runs.append(np.zeros(rows.size))
                continue
            moved = moved + l * hit
            runs.append(l * base[rows] * (mass / held))
        # 1 − moved ≥ 1 − Σ λ ≥ 0 in exact arithmetic; weights rescaled to sum 1 can sum to 1 + 2⁻⁵²
        # in floating point, and a household several flips change must not get a negative weight
        return np.concatenate([np.maximum(1.0 - moved, 0.0) * base, *runs])


def widen(public: HierarchicalData, flips: Sequence[Flip], public_prior: np.ndarray | None = None,
          public_cache: IncidenceCache | None = None) -> WidenedSupport:
    """The public households and, per flip, the flipped copies of those it changes and copies
    (:func:`copied`; :class:`WidenedSupport`); ``public_prior``: the public households' prior
    weights (uniform when None); ``public_cache``: the public support's incidence cache, from which
    the widened support takes the incidences and patterns of every workload that reads no flipped
    attribute (a copy's column equals its public household's there), so that they are built once
    for both supports."""
    if not flips:
        raise ValueError("widen needs at least one flip")
    _distinct_names(flips)
    if public_cache is not None and public_cache.data is not public:
        raise ValueError("public_cache belongs to other households than the public ones")
    hits = tuple(changed(public, f) for f in flips)
    rows = tuple(_held(h, f) for h, f in zip(hits, flips))
    data = HierarchicalData.concat([public, *(flipped(public.take(r), f) for f, r in zip(flips, rows))])
    base = Support.from_data(public, public_prior).weights
    weights = np.concatenate([base, np.zeros(data.n_households - public.n_households)])
    varied = frozenset(name for f in flips for name in (f.attribute, *f.householder_attributes))
    origins = np.concatenate([np.arange(public.n_households), *rows]).astype(np.int64)
    cache = IncidenceCache(data, (IncidenceCache(public) if public_cache is None else public_cache, varied, origins))
    return WidenedSupport(Support(data, weights, cache), tuple(flips), public.n_households, hits, rows)


def _distinct_names(flips: Sequence[Flip]) -> tuple[str, ...]:
    """The flips' names (:attr:`Flip.name`), refused when one relabelling is named twice."""
    names = tuple(f.name for f in flips)
    if len(set(names)) != len(names):
        raise ValueError(f"prior flips name a relabelling twice: {list(names)}")
    return names


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


def choose_mixture(public: Support, flips: Sequence[Flip], measurements: Sequence[Measurement], total: float,
                   min_gain: float = MIN_GAIN) -> MixtureChoice:
    """λ (module docstring; the public prior: ``public``'s weights) for ``flips`` from the noisy
    answers of ``measurements`` at the node's household ``total`` G: minimise
    Σ_cells ((y − G·A p_λ) / σ)² over λ ≥ 0, Σ λ ≤ 1. Each flipped copy's expected answers are the
    public prior's with their cells relabelled (:func:`relabelled_cells`), so the choice needs no
    widened support: only the flips it weighs in are built (:func:`node_prior`)."""
    ms = [m for m in measurements if m.noisy_answer.size]
    names = _distinct_names(flips)
    k = len(flips)
    if not ms:
        return MixtureChoice(names, (0.0,) * k, (0.0,) * k, (0.0, 0.0))
    if any(m.sigma <= 0 for m in ms):
        raise ValueError("the mixture fit needs measurements with positive noise")
    G = max(float(total), 1.0)
    d = public.data.domain
    base = [public.answer(m.workload, public.weights / public.weights.sum()) for m in ms]
    answers = [np.concatenate(base)] + [np.concatenate([b[relabelled_cells(m.workload, d, f)] for m, b in zip(ms, base)]) for f in flips]
    y = np.concatenate([m.noisy_answer for m in ms])
    inv_sd = np.concatenate([np.full(m.noisy_answer.size, 1.0 / m.sigma) for m in ms])
    r = inv_sd * (y - G * answers[0])
    D = np.stack([inv_sd * G * (a - answers[0]) for a in answers[1:]], axis=1)
    lam = _fit(D, r, list(range(k)))
    fitted = tuple(float(x) for x in lam)
    rss0 = float(r @ r)
    # each flip is kept only while it gains min_gain on its own: the one whose removal costs least
    # goes first, the rest refitted (a flip weighed in at noise level would widen every later fit)
    kept = [i for i in range(k) if lam[i] > 0]
    while kept:
        losses = [_rss(D, r, _fit(D, r, [j for j in kept if j != i])) - _rss(D, r, lam) for i in kept]
        worst = int(np.argmin(losses))
        if 0.5 * losses[worst] >= min_gain:
            break
        kept.pop(worst)
        lam = _fit(D, r, kept)
    rss1 = _rss(D, r, lam)
    keep = bool(kept) and 0.5 * (rss0 - rss1) >= min_gain
    return MixtureChoice(names, tuple(float(x) for x in lam) if keep else (0.0,) * k, fitted, (rss0, rss1))


def _fit(D: np.ndarray, r: np.ndarray, columns: list[int]) -> np.ndarray:
    """λ ≥ 0 with Σ λ ≤ 1 minimising ‖r − D λ‖² over ``columns`` (the others 0)."""
    lam = np.zeros(D.shape[1])
    if columns:
        lam[columns] = np.clip(lsq_linear(D[:, columns], r, bounds=(0.0, 1.0)).x, 0.0, 1.0)
        if lam.sum() > 1.0:
            lam = lam / lam.sum()
    return lam


def _rss(D: np.ndarray, r: np.ndarray, lam: np.ndarray) -> float:
    return float(np.sum((r - D @ lam) ** 2))


def node_prior(public: Support, flips: Sequence[Flip], measurements: Sequence[Measurement], total: float,
               widen_by: Callable[[tuple[Flip, ...]], WidenedSupport] | None = None) -> tuple[Support, np.ndarray, MixtureChoice | None]:
    """A state's support and prior: the public support and its weights, or — where
    :func:`choose_mixture` takes flipped copies in — the public households and the copies of the
    flips it weighs in (those of weight 0 left out: they would only widen every later fit), with the
    mixture prior; the choice (None without ``flips``). ``widen_by``: builds the widened support of
    the flips weighed in (a cache's; :func:`widen` on the public support by default)."""
    if not flips:
        return public, public.weights, None
    choice = choose_mixture(public, flips, measurements, total)
    if not choice.widened:
        return public, public.weights, choice
    used = used_flips(flips, choice)
    widened = (widen_by or (lambda fl: widen(public.data, fl, public_cache=public.cache)))(used)
    return widened.support, widened.prior(public.weights, [w for w in choice.weights if w > 0]), choice


def used_flips(flips: Sequence[Flip], choice: MixtureChoice | None) -> tuple[Flip, ...]:
    """The flips whose copies a node's support holds after :func:`node_prior`'s ``choice``, each
    with the share of its changed households copied (:func:`copy_share` of its weight)."""
    if choice is None or not choice.widened:
        return ()
    weight = dict(zip(choice.attributes, choice.weights))
    return tuple(f.sharing(copy_share(weight[f.name], choice.weights)) for f in flips if weight.get(f.name, 0.0) > 0)
