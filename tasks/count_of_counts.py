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
from typing import Any

import numpy as np
import pyarrow as pa
from prefect import task

from engine.count_of_counts import Hierarchy, fit_histograms, fit_household_counts, geography_hierarchy, size_histograms
from engine.data import LEVELS, HierarchicalData, npz_names, parse_node_key, read_npz
from engine.errors import PrivacyInvariantError
from engine.privacy import PrivateSession
from tasks.context import RunContext
from tasks.run_context import save_npz_atomic

STAGE = "count_of_counts"
COUNTS_STAGE = "group_counts"


def hierarchy_of(session: PrivateSession) -> Hierarchy:
    """nation → states → PUMAs of the declared geography (public; PUMAs without private households included)."""
    return geography_hierarchy(np.array(session.nodes("puma"), dtype=np.int64).reshape(-1, 2))


def _group_count_measurements(ctx: RunContext, session: PrivateSession, h: Hierarchy) -> list[tuple[np.ndarray, np.ndarray]]:
    """The ``group_counts`` stage: a discrete Gaussian household count per node of every level
    with a positive share. One (values, variances) pair per level, NaN off that level."""
    out = []
    shares = ctx.cfg.allocation.levels.get(COUNTS_STAGE, {}) if ctx.cfg.allocation.stages.get(COUNTS_STAGE, 0) > 0 else {}
    for lv, name in enumerate(LEVELS):
        if shares.get(name, 0) <= 0:
            continue
        vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
        rho = ctx.allocation(COUNTS_STAGE, name)
        for i in h.level_range(lv):
            m = session.measure_household_count(COUNTS_STAGE, name, parse_node_key(h.keys[i]), rho)
            vals[i], var[i] = float(m.noisy_answer[0]), m.variance
        out.append((vals, var))
    return out


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
def count_of_counts_task(ctx: RunContext) -> str:
    """Measure every node's size counts, fit G, estimate Hc and make it consistent top-down."""
    out = ctx.paths.node_path(STAGE, "hierarchy")
    if out.exists():
        return str(out)
    session = ctx.session()
    K = session.domain.max_size
    h = hierarchy_of(session)
    mech = ctx.cfg.advanced.count_of_counts.mechanism
    at_least, variances, measured = {}, [], _group_count_measurements(ctx, session, h)
    sd, raw = np.zeros(h.n_nodes), np.zeros((h.n_nodes, K))
    for lv, name in enumerate(LEVELS):
        ids = h.level_range(lv)
        ms = [session.measure_sizes(STAGE, name, parse_node_key(h.keys[i]), K, ctx.allocation(STAGE, name), mech) for i in ids]
        at_least[lv] = np.stack([m.at_least for m in ms])
        raw[ids] = np.stack([m.histogram for m in ms])
        vals, var = np.full(h.n_nodes, np.nan), np.full(h.n_nodes, np.nan)
        vals[ids], var[ids] = at_least[lv][:, 0], ms[0].count_variance
        measured.append((vals, var))
        sd[ids] = ms[0].histogram_sd
        variances.append(ms[0].count_variance)  # every at-least entry's noise variance is at most G's
    G = household_counts(session, h, measured)
    H = fit_histograms(h, at_least, G[0], variances, K, ctx.cfg.advanced.count_of_counts.consistency)
    return _save(ctx, STAGE, h, G, (H, raw, sd))


@task(name="household-counts")
def household_counts_task(ctx: RunContext) -> str:
    """G per node without the count-of-counts stage: the ``group_counts`` stage's measurements
    made consistent, or exact under the invariant."""
    out = ctx.paths.node_path(COUNTS_STAGE, "hierarchy")
    if out.exists():
        return str(out)
    session = ctx.session()
    h = hierarchy_of(session)
    return _save(ctx, COUNTS_STAGE, h, household_counts(session, h, _group_count_measurements(ctx, session, h)))


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
