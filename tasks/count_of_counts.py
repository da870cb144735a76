"""Household counts and the count-of-counts stage (Kuo et al., VLDB 2018), through the private
session: every number about the private households that leaves here is post-processing of
charged measurements, unless the release declares ``invariants: [puma_household_counts]``.

- ``count_of_counts_task``: per node of every level, the household sizes 1..K measured with the
  discrete Gaussian (default) or the paper's discrete Laplace, in the form that is cheaper for the
  privacy unit (``engine.privacy._session.size_form``: the size histogram under both units). The
  noisy G of every node (and of the ``group_counts`` stage, when it has a share) are merged by
  inverse variance and made consistent (nonnegative integers, children summing to their parent;
  exact integer least squares). Then
  Hc[i] = G − (households of size ≥ i+1) is estimated per node (isotonic L1) and made consistent
  top-down. Synthesis uses the raw noisy size histograms as measurements of the size marginal
  (``size_measurements``: independent noise of the known σ), weighed against its own
  measurements by their precision; the released count-of-counts table is then the size
  histograms of the released microdata. (The consistent estimates are post-processed — rounded,
  isotonic, matched across levels — so their errors are neither independent nor of the raw σ:
  fitted as measurements of that σ they would pull the posteriors off with a confidence they do
  not have; ``benchmarks/results/HISTORY.md``.)
- ``household_counts_task``: without the count-of-counts stage, G per node from the
  ``group_counts`` stage alone (or exact under the invariant).

Both persist ``keys``, ``level``, ``households`` (G per node) and ``households_sd`` (the noise
standard deviation of the node's own merged count measurements, 0 under the invariant, an upper
bound for the consistent G's); the count-of-counts result also
``histograms`` (consistent), ``raw_histograms`` (the noisy measurements, histogram form) and
``histogram_sd`` (the noise standard deviation of one raw histogram entry of the node's level).
Synthesis reads its node totals and size measurements from there.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from prefect import task

from engine.count_of_counts import Hierarchy, fit_histograms, fit_household_counts, geography_hierarchy, size_histograms
from engine.data import LEVELS, Geography, HierarchicalData, npz_names, parse_node_key, read_npz
from engine.errors import PrivacyInvariantError
from engine.privacy import PrivateSession
from tasks.context import RunContext
from tasks.run_context import save_npz_atomic

STAGE = "count_of_counts"
COUNTS_STAGE = "group_counts"


def hierarchy_of(geography: Geography) -> Hierarchy:
    """nation → states → PUMAs of the declared geography (public; PUMAs without private households included)."""
    return geography_hierarchy(np.array(geography.nodes("puma"), dtype=np.int64).reshape(-1, 2))


@dataclass(frozen=True)
class NodeCounts:
    """What one part's task measured (:func:`measure_nodes_task`) for its nodes ``ids`` (hierarchy
    indices): per level of the ``group_counts`` stage with a share, the noisy household count and
    its noise variance of each node of that level (NaN elsewhere); with the size counts, each
    node's noisy households of size at least k and of size k, the noise variance of the former's
    first entry and the sd of one of the latter's. Noisy measurements only."""

    ids: np.ndarray
    group: dict[int, tuple[np.ndarray, np.ndarray]]
    at_least: np.ndarray | None = None
    histogram: np.ndarray | None = None
    count_variance: np.ndarray | None = None
    histogram_sd: np.ndarray | None = None


def node_parts(h: Hierarchy, parts: int) -> list[np.ndarray]:
    """The hierarchy's nodes in up to ``parts`` groups of whole states (a state with its PUMAs; the
    nation with the first group), balanced by their node counts (longest first onto the smallest
    group): the count stages' measurements, one task per group, spread over the workers."""
    states = h.level_range(1)
    members = [np.concatenate([[s], np.flatnonzero(h.parent == s)]) for s in states]
    groups: list[list[np.ndarray]] = [[] for _ in range(max(1, min(parts, len(members))))]
    sizes = np.zeros(len(groups), dtype=np.int64)
    for i in sorted(range(len(members)), key=lambda i: -members[i].size):
        g = int(np.argmin(sizes))
        groups[g].append(members[i])
        sizes[g] += members[i].size
    groups[0].insert(0, h.level_range(0))
    return [np.sort(np.concatenate(g)).astype(np.int64) for g in groups if g]


@task(name="measure-node-counts")
def measure_nodes_task(ctx: RunContext, ids: np.ndarray, sizes: bool) -> NodeCounts:
    """The household counts of the ``group_counts`` stage (each level with a share) and, with
    ``sizes``, the count-of-counts stage's household sizes 1..K (:meth:`PrivateSession.measure_sizes`)
    of the nodes ``ids``, each measured once (a rerun reads them back)."""
    session = ctx.session()
    h = hierarchy_of(session.geography)
    ids = np.asarray(ids, dtype=np.int64)
    shares = ctx.cfg.allocation.levels.get(COUNTS_STAGE, {}) if ctx.cfg.allocation.stages.get(COUNTS_STAGE, 0) > 0 else {}
    group = {}
    for lv, name in enumerate(LEVELS):
        if shares.get(name, 0) <= 0:
            continue
        vals, var = np.full(ids.size, np.nan), np.full(ids.size, np.nan)
        rho = ctx.allocation(COUNTS_STAGE, name)
        for j in np.flatnonzero(h.level[ids] == lv):
            m = session.measure_household_count(COUNTS_STAGE, name, parse_node_key(h.keys[ids[j]]), rho)
            vals[j], var[j] = float(m.noisy_answer[0]), m.variance
        group[lv] = (vals, var)
    if not sizes:
        return NodeCounts(ids, group)
    K, mech = session.domain.max_size, ctx.cfg.advanced.count_of_counts.mechanism
    ms = [session.measure_sizes(STAGE, LEVELS[h.level[i]], parse_node_key(h.keys[i]), K, ctx.allocation(STAGE, LEVELS[h.level[i]]), mech)
          for i in ids]
    return NodeCounts(ids, group, np.stack([m.at_least for m in ms]).reshape(ids.size, K),
                      np.stack([m.histogram for m in ms]).reshape(ids.size, K),
                      np.array([m.count_variance for m in ms]), np.array([m.histogram_sd for m in ms]))


def _level_constant(values: np.ndarray, what: str, lv: int) -> float:
    """The one value every node of a level shares (its noise scale: one allocation per level)."""
    if values.size == 0 or not np.all(values == values[0]):
        raise PrivacyInvariantError(f"the {what} of the {LEVELS[lv]} nodes' measurements is not one value: {np.unique(values)}")
    return float(values[0])


def _group_count_measurements(h: Hierarchy, parts: list[NodeCounts]) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``group_counts`` stage's measurements of every node: one (values, variances) pair per
    level with a share, NaN off that level."""
    out = []
    for lv in sorted(parts[0].group):
        vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
        for p in parts:
            v, s = p.group[lv]
            on = h.level[p.ids] == lv
            vals[p.ids[on]], var[p.ids[on]] = v[on], s[on]
        out.append((vals, var))
    return out


def _covers(h: Hierarchy, parts: list[NodeCounts]) -> None:
    ids = np.concatenate([p.ids for p in parts])
    if ids.size != h.n_nodes or not np.array_equal(np.sort(ids), np.arange(h.n_nodes)):
        raise PrivacyInvariantError("the count measurements' parts do not cover every node of the hierarchy once")


def household_counts(session: PrivateSession, h: Hierarchy, measured: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(G, sd) per node, each (N,): G exact (sd 0) under the ``puma_household_counts``
    invariant; otherwise the nonnegative integer, consistent least-squares fit of every noisy count
    (inverse-variance weights), with sd the standard deviation of the node's own merged
    measurements — an upper bound for the consistent fit's, which also borrows its parent's and
    children's information. Synthesis weighs G against its own measurements by it."""
    if "puma_household_counts" in session.invariants:
        exact = session.invariant_household_counts()
        leaf = np.zeros(h.n_nodes, dtype=np.int64)
        for i in h.leaves():
            leaf[i] = exact[parse_node_key(h.keys[i])]
        return h.aggregate_up(leaf), np.zeros(h.n_nodes)
    if not measured:
        raise PrivacyInvariantError("no household-count measurement and no invariant (the config check should have refused this)")
    return fit_household_counts(h, measured)


def _save(ctx: RunContext, name: str, h: Hierarchy, G: tuple[np.ndarray, np.ndarray],
          histograms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> str:
    """``histograms``: (the consistent histograms, the raw noisy ones, the noise sd of one raw
    entry per node), saved together."""
    out = ctx.paths.node_path(name, "hierarchy")
    arrays: dict[str, Any] = dict(keys=np.array(h.keys), level=h.level, households=np.asarray(G[0], dtype=np.int64),
                                  households_sd=np.asarray(G[1], dtype=np.float64))
    if histograms is not None:
        H, raw, histogram_sd = histograms
        arrays.update(histograms=H, raw_histograms=raw, K=H.shape[1] - 1, histogram_sd=histogram_sd)
    save_npz_atomic(out, lambda f: np.savez(f, **arrays))
    return str(out)


@task(name="count-of-counts")
def count_of_counts_task(ctx: RunContext, parts: list[NodeCounts]) -> str:
    """Fit G from every node's noisy counts (``parts``: :func:`measure_nodes_task` over
    :func:`node_parts`), estimate Hc and make it consistent top-down."""
    session = ctx.session()
    h = hierarchy_of(session.geography)
    _covers(h, parts)
    K = session.domain.max_size
    at_least, variances, measured = {}, [], _group_count_measurements(h, parts)
    sd, raw = np.zeros(h.n_nodes), np.zeros((h.n_nodes, K))
    ids = np.concatenate([p.ids for p in parts])
    count_variance = np.concatenate([p.count_variance for p in parts])
    histogram_sd = np.concatenate([p.histogram_sd for p in parts])
    first = np.concatenate([p.at_least for p in parts])
    raw[ids] = np.concatenate([p.histogram for p in parts])
    for lv in range(len(LEVELS)):
        on = h.level[ids] == lv
        order = np.argsort(ids[on])  # the level's nodes in hierarchy order
        at_least[lv] = first[on][order]
        cv = _level_constant(count_variance[on], "noise variance", lv)
        sd[ids[on]] = _level_constant(histogram_sd[on], "noise sd", lv)
        vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
        vals[h.level_range(lv)], var[h.level_range(lv)] = at_least[lv][:, 0], cv
        measured.append((vals, var))
        variances.append(cv)  # every at-least entry's noise variance is at most G's
    G = household_counts(session, h, measured)
    H = fit_histograms(h, at_least, G[0], variances, K, ctx.cfg.advanced.count_of_counts.consistency)
    return _save(ctx, STAGE, h, G, (H, raw, sd))


@task(name="household-counts")
def household_counts_task(ctx: RunContext, parts: list[NodeCounts]) -> str:
    """G per node without the count-of-counts stage: the ``group_counts`` stage's measurements
    (``parts``: :func:`measure_nodes_task` without sizes) made consistent, or exact under the invariant."""
    session = ctx.session()
    h = hierarchy_of(session.geography)
    _covers(h, parts)
    return _save(ctx, COUNTS_STAGE, h, household_counts(session, h, _group_count_measurements(h, parts)))


def load_result(path: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(node keys, levels, histograms) of a count-of-counts result."""
    z = read_npz(path, ("keys", "level", "histograms"))
    return [str(k) for k in z["keys"]], z["level"], z["histograms"]


def node_households(path: str) -> dict[str, int]:
    """{node key: household count} of a count-of-counts or household-counts result (DP, or exact
    only under the declared invariant)."""
    z = read_npz(path, ("keys", "households"))
    return {str(k): int(g) for k, g in zip(z["keys"], z["households"])}


def node_household_sd(path: str) -> dict[str, float]:
    """{node key: noise standard deviation of its household count} (0 under the invariant; inf
    where no measurement covers the node's own level)."""
    z = read_npz(path, ("keys", "households_sd"))
    return {str(k): float(s) for k, s in zip(z["keys"], z["households_sd"])}


def has_histograms(path: str) -> bool:
    return "histograms" in npz_names(path)


def size_measurements(path: str, level: str) -> dict[tuple[int, ...], tuple[list[float], float]]:
    """{node: (noisy households of size 1..K, noise sd of one entry)} of one level of a
    count-of-counts result: the raw size measurements (histogram form; from a measurement of the
    at-least counts, their differences, whose sd is √2 σ), which synthesis fits with its own
    measurements."""
    lv_index = LEVELS.index(level)
    z = read_npz(path, ("keys", "level", "raw_histograms", "histogram_sd"))
    keys, lv, raw, sd = z["keys"], z["level"], z["raw_histograms"], z["histogram_sd"]
    return {parse_node_key(str(k)): (row.astype(np.float64).tolist(), float(s)) for k, l, row, s in zip(keys, lv, raw, sd) if l == lv_index}


def release_histograms(path: str, release: Iterable[HierarchicalData]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(node keys, levels, (N, K+1) histograms) of the released microdata (given in parts, e.g.
    ``tasks.release_parts.ReleaseParts``, whose counts add up) over the nodes of the count-of-counts
    result at ``path``: the table the release publishes, equal to the microdata's household sizes
    and consistent across levels by construction."""
    keys, level, H = load_result(path)
    leaves = np.array([parse_node_key(k) for k, lv in zip(keys, level) if lv == 2], dtype=np.int64).reshape(-1, 2)
    h = geography_hierarchy(leaves)
    order = np.array([h.index[k] for k in keys], dtype=np.int64)
    total = sum((size_histograms(h, part.geo, part.sizes, H.shape[1] - 1) for part in release), np.zeros((h.n_nodes, H.shape[1]), dtype=np.int64))
    return keys, level, total[order]


def as_table(keys: list[str], level: np.ndarray, H: np.ndarray) -> pa.Table:
    """The release's count_of_counts.parquet: (level, node, size, households), sizes 1..K."""
    K = H.shape[1] - 1
    n = len(keys)
    return pa.table(
        {
            "level": pa.array(np.repeat(np.array(LEVELS)[level], K).tolist(), pa.string()),
            "node": pa.array(np.repeat(np.array(keys), K).tolist(), pa.string()),
            "size": pa.array(np.tile(np.arange(1, K + 1), n).astype(np.int16)),
            "households": pa.array(H[:, 1:].reshape(-1).astype(np.int64)),
        }
    )
