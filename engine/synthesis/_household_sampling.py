"""Drawing synthetic households from a posterior on a support of public households (Tao et al.
Alg. 2 line 16: "sample ñ_g tuples from p_g"), optionally with exactly the household-size counts
fixed by the count-of-counts stage; :func:`household_order` stratifies a systematic draw on the
household attributes; ``method="balanced"`` holds the draw's low-order marginals to the
posterior's (:mod:`engine.synthesis._balanced_sampling`), and :func:`sample_sibling_households` draws a state's
PUMAs so that their sum stays balanced too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from engine.data import HierarchicalData
from engine.queries import Support
from engine.synthesis._balanced_sampling import BalanceTargets, balanced_draw, balanced_draws, systematic_positions

__all__ = ["household_order", "sample_households", "sample_sibling_households"]


def _draw(p: np.ndarray, n: int, rng: np.random.Generator, method: str) -> np.ndarray:
    if method == "systematic":
        return systematic_positions(p, n, float(rng.random())) if n > 0 else np.zeros(0, dtype=np.int64)
    if method != "multinomial":
        raise ValueError(f"unknown sampling method {method!r}")
    if n <= 0:
        return np.zeros(0, dtype=np.int64)
    cdf = np.cumsum(p / p.sum())
    cdf[-1] = 1.0
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), p.size - 1).astype(np.int64)


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
    method: Literal["systematic", "multinomial", "balanced"] = "systematic",
    geo: Sequence[int] | None = None,
    order: np.ndarray | None = None,
    balance: BalanceTargets | None = None,
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
    ``"multinomial"``: i.i.d. draws; ``"balanced"``: a systematic pool of draws thinned to ``n``
    so that the sample's low-order marginals match the posterior's expected counts
    (:func:`engine.synthesis._balanced_sampling.balanced_draw`; needs ``balance``, the support's
    :class:`~engine.synthesis._balanced_sampling.BalanceTargets`, and ``n`` without ``sizes``). Output order is shuffled. ``geo``: optional full geography
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
        if order is not None:
            order = np.asarray(order, dtype=np.int64)
            if order.shape != p.shape or np.any(np.bincount(order, minlength=p.size) != 1):
                raise ValueError("order must be a permutation of the support's households")
        if method == "balanced":
            if balance is None or balance.n_households != p.size:
                raise ValueError("balanced sampling needs the support's balance targets")
            idx = balanced_draw(balance, p, int(n), rng, order)
        elif order is None:
            idx = _draw(p, int(n), rng, method)
        else:
            idx = order[_draw(p[order], int(n), rng, method)]
    elif method == "balanced":
        raise ValueError("balanced sampling draws n households, not fixed size counts")
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
    return _households(data, idx, rng, geo)


def sample_sibling_households(
    support: Support,
    weights: Sequence[np.ndarray],
    totals: Sequence[int],
    rngs: Sequence[np.random.Generator],
    geos: Sequence[Sequence[int]],
    *,
    order: np.ndarray | None = None,
    balance: BalanceTargets,
) -> list[HierarchicalData]:
    """The households of sibling nodes (a state's PUMAs), each drawn from its own posterior by
    balanced sampling with the earlier siblings' residual carried over
    (:func:`engine.synthesis._balanced_sampling.balanced_draws`), so that the parent's balance marginals stay
    near the posteriors' sum; otherwise as :func:`sample_households` with ``method="balanced"``,
    node by node (``totals``, ``rngs`` and ``geos`` one per node, in drawing order)."""
    if not (len(weights) == len(totals) == len(rngs) == len(geos)):
        raise ValueError("give one total, generator and geography row per node")
    if balance.n_households != support.data.n_households:
        raise ValueError("balanced sampling needs the support's balance targets")
    if order is not None:
        order = np.asarray(order, dtype=np.int64)
        if order.shape != (support.data.n_households,) or np.any(np.bincount(order, minlength=order.size) != 1):
            raise ValueError("order must be a permutation of the support's households")
    draws = balanced_draws(balance, [np.asarray(w, dtype=np.float64) for w in weights], [int(n) for n in totals], rngs, order)
    return [_households(support.data, idx, rng, geo) for idx, rng, geo in zip(draws, rngs, geos)]


def _households(data: HierarchicalData, idx: np.ndarray, rng: np.random.Generator, geo: Sequence[int] | None) -> HierarchicalData:
    """The drawn support households in a shuffled order, with ``geo`` written into every one."""
    idx = idx[rng.permutation(idx.size)]
    out = data.take(idx)
    if geo is not None:
        row = np.asarray(geo, dtype=np.int32).reshape(1, -1)
        out = out.with_geo(np.repeat(row, out.n_households, axis=0))
    return out
