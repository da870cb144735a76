"""The release's ``intervals.parquet``: an error estimate beside every released answer of the
count-of-counts table and of every marginal the synthesis measured at a node.

Everything here is post-processing of what the release is a function of — the released
microdata, the noise of the stored measurements (mechanism and scale, as published in
``measurements.parquet``), the synthesis fits' posteriors (functions of the noisy measurements)
and the sampling seed — never of the confidential data. The mathematics is
:mod:`engine.synthesis`:

- ``table = count_of_counts``: every cell of ``count_of_counts.parquet`` (every node, sizes
  1..K), by a parametric bootstrap of the count-of-counts stage's own estimator
  (``engine.count_of_counts.fit_household_counts`` and ``fit_histograms``), simulated from the
  released histograms with the stored noise, :data:`engine.synthesis.BOOTSTRAP_REPLICATES`
  replicates seeded from the sampling seed;
- ``table = marginal``: every cell of every workload measured by the state and PUMA updates, at
  its node, answered by the released microdata; sd of the MAP update's error (a Laplace
  approximation whose prior error is estimated by empirical Bayes from the noisy answers'
  residuals against the prior), computed by the synthesis task after its fit (``answer_sd`` in
  the node's diagnostics, :func:`engine.synthesis.fit_answer_sd`).

Rows are sorted by table, node, marginal and cell: a replay writes the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa

from engine.count_of_counts import fit_histograms, fit_household_counts, geography_hierarchy
from engine.data import LEVELS, Domain, HierarchicalData, node_households, parse_node_key
from engine.privacy import MeasurementRecord as Measurement
from engine.queries import Workload, node_answers
from engine.synthesis import (
    BOOTSTRAP_REPLICATES,
    CountNoise,
    Intervals,
    SizeNoise,
    combine_total,
    count_of_counts_bootstrap,
    intervals,
)
from schemas.release_schema import INTERVALS_SCHEMA
from tasks.count_of_counts import COUNTS_STAGE, STAGE
from tasks.measurements_table import cell_labels
from tasks.release_parts import ReleaseParts

__all__ = ["TABLE", "count_of_counts_intervals", "intervals_table", "manifest_entry", "marginal_intervals", "uncertainty_rng"]

TABLE = "intervals.parquet"
SPAWN_KEY = (0x75, 0x6E, 0x63)  # "unc": a stream of the sampling seed no node's (1 or 2 entries) can share


def uncertainty_rng(seed: int) -> np.random.Generator:
    """The bootstrap's randomness: post-processing, reproducible from the sampling seed."""
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=SPAWN_KEY))


def _rows(table: str, level: str, keys: list[str], marginal: str, codes: pa.Array, released, iv: Intervals, method: str) -> pa.Table:
    """The rows of one marginal at the nodes ``keys`` (``released`` and the intervals: one row of
    cells per node)."""
    cells, n = len(codes), len(codes) * len(keys)
    return pa.table({
        "table": pa.array([table] * n, pa.string()), "level": pa.array([level] * n, pa.string()),
        "node": pa.array(np.repeat(np.array(keys, dtype=object), cells), pa.string()), "marginal": pa.array([marginal] * n, pa.string()),
        "cell": pa.array(np.tile(np.arange(cells, dtype=np.int32), len(keys))), "cell_codes": pa.concat_arrays([codes] * len(keys)) if keys else codes[:0],
        "released": pa.array(np.asarray(released, dtype=np.float64).reshape(-1)), "se": pa.array(iv.se.reshape(-1)),
        "bias": pa.array(iv.bias.reshape(-1)), "lo90": pa.array(iv.lo90.reshape(-1)), "hi90": pa.array(iv.hi90.reshape(-1)),
        "method": pa.array([method] * n, pa.string()),
    }, schema=INTERVALS_SCHEMA)


def count_of_counts_intervals(keys: list[str], level: np.ndarray, released: np.ndarray, measurements: Iterable[Measurement],
                              domain: Domain, consistency: str, exact_counts: bool, seed: int,
                              replicates: int = BOOTSTRAP_REPLICATES) -> pa.Table:
    """Rows for the count-of-counts table: ``keys``, ``level``, ``released`` as
    ``tasks.count_of_counts.release_histograms`` gives them ((N, K+1), the released microdata's
    sizes); ``measurements``: the run's stored measurements, of which only the noise of the size
    and household-count measurements is used; ``exact_counts``: the ``puma_household_counts``
    invariant (G then taken as released)."""
    leaves = np.array([parse_node_key(k) for k, lv in zip(keys, level) if lv == 2], dtype=np.int64).reshape(-1, 2)
    h = geography_hierarchy(leaves)
    order = np.array([h.index[k] for k in keys], dtype=np.int64)
    H = np.zeros((h.n_nodes, released.shape[1] - 1), dtype=np.int64)
    H[order] = released[:, 1:]
    K = H.shape[1]
    sizes: dict[int, SizeNoise] = {}
    counts: dict[int, CountNoise] = {}
    for m in measurements:
        if m.stage == STAGE and m.workload_id.startswith("size_"):
            sizes.setdefault(LEVELS.index(m.level), SizeNoise(m.workload_id.removeprefix("size_"), m.mechanism, float(m.scale), m.variance))
        elif m.stage == COUNTS_STAGE and m.workload_id == "households":
            counts.setdefault(LEVELS.index(m.level), CountNoise(m.mechanism, float(m.scale), m.variance))
    if set(sizes) != set(range(h.n_levels)):
        raise ValueError("the count-of-counts bootstrap needs the size measurement of every level")
    # the noise variance the task passes per level (NoisySizes.count_variance: that of G's entry)
    variances = [sizes[lv].variance * (K if sizes[lv].form == "histogram" else 1) for lv in range(h.n_levels)]
    G_released = H.sum(axis=1)

    def estimator(at_least, measured):
        G = G_released if exact_counts else fit_household_counts(h, measured)[0]
        return fit_histograms(h, at_least, G, variances, K, consistency)[:, 1:]

    iv = count_of_counts_bootstrap(h, H, sizes, counts, estimator, uncertainty_rng(seed), replicates)
    codes, _ = cell_labels("size_histogram", K, domain)
    parts = [_rows("count_of_counts", LEVELS[lv], [str(h.keys[i]) for i in ids], "size_histogram", codes, H[ids],
                   Intervals(iv.se[ids], iv.bias[ids], iv.lo90[ids], iv.hi90[ids]), "parametric_bootstrap")
             for lv in range(h.n_levels) if (ids := h.level_range(lv)).size]
    return pa.concat_tables(parts)


def marginal_intervals(node_files: Iterable[str | Path], release: HierarchicalData | ReleaseParts, method: str = "map_eb") -> pa.Table:
    """Rows for the measured marginals: per synthesis node result (its ``.json`` with
    ``answer_sd`` and ``total_var``; results of older runs without them are skipped), every
    measured workload's cells answered by the released microdata of that node, ± Z90 sd. The sd
    combines the fit's at a fixed total with the released total's variance
    (:func:`engine.synthesis.combine_total`): a PUMA's own fitted total; for a state, whose
    released answer is the sum of its PUMAs', the sum of its PUMAs' total variances (they were
    fitted independently), not the state fit's, and the state fit's sd is widened by the sum of
    its PUMA fits' responses to their own noise on the state's workloads (``response_sd``,
    :func:`engine.synthesis._uncertainty.response_count_sd`). A state's size histogram is left to the
    count-of-counts rows: the sum of its PUMAs' fitted sizes follows the PUMAs' count-of-counts
    histograms, i.e. the state's count-of-counts estimate, more than the state fit. The release is
    read one part (whole states, :class:`tasks.release_parts.ReleaseParts`) at a time."""
    records = [json.loads(Path(f).with_suffix(".json").read_text()) for f in node_files]
    nodes = [parse_node_key(r["node"]) for r in records]
    total_var = {node: float(r.get("total_var", 0.0)) for node, r in zip(nodes, records)}
    response: dict[tuple[int, str], np.ndarray] = {}  # (state, workload id): Σ over its PUMAs of the response variance
    for node, r in zip(nodes, records):
        for wid, sd in (r.get("response_sd") or {}).items():
            response[(node[0], wid)] = response.get((node[0], wid), 0.0) + np.asarray(sd) ** 2
    parts = release if isinstance(release, ReleaseParts) else ReleaseParts.of(release)
    size_id = Workload("group", (parts.domain.size_attribute,), ()).id
    puma_var: dict[int, float] = {}  # a state's released total sums its PUMAs', fitted independently
    for n, v in total_var.items():
        if len(n) == 2:
            puma_var[n[0]] = puma_var.get(n[0], 0.0) + v
    by_state: dict[int, list[int]] = {}
    for i, r in enumerate(records):
        if r.get("answer_sd"):
            by_state.setdefault(nodes[i][0], []).append(i)

    def answered(ids: list[int], data: HierarchicalData) -> list[pa.Table]:
        """The rows of the records ``ids`` (nodes of ``data``'s states): per state, each workload
        answered once on its households, per PUMA; a state's answer is its PUMAs' sum (integer
        counts: exact). One table per level and workload."""
        found: dict[tuple[int, str], list[tuple[int, np.ndarray, int]]] = {}  # (depth, wid): (record, released, households)
        states = node_households(data.geo, 1)  # one sort, not a mask per node
        of_state: dict[int, list[int]] = {}
        for i in ids:
            of_state.setdefault(nodes[i][0], []).append(i)
        for st, mine in sorted(of_state.items()):
            sub = data.take(states.get((st,), nothing))
            pumas = node_households(sub.geo, 2)
            position = {node: j for j, node in enumerate(sorted(pumas))}
            node_of = np.empty(sub.n_households, dtype=np.int64)
            for node, j in position.items():
                node_of[pumas[node]] = j
            sizes = np.bincount(node_of, minlength=len(position))
            wids = {wid for i in mine for wid in records[i]["answer_sd"]}
            for wid in sorted(wids):
                M = node_answers(sub, Workload.from_id(wid), node_of, len(position))
                for i in mine:
                    node = nodes[i]
                    if wid not in records[i]["answer_sd"] or (len(node) == 1 and wid == size_id):
                        continue  # a state's released sizes are its PUMAs' sum, which tracks the count-of-counts estimate
                    if len(node) == 1:
                        got = (M.sum(axis=0), sub.n_households)
                    else:
                        row = position.get(node)
                        got = (np.zeros(M.shape[1]), 0) if row is None else (M[row], int(sizes[row]))
                    found.setdefault((len(node), wid), []).append((i, *got))
        out = []
        for (depth, wid), rows in sorted(found.items()):
            released = np.stack([r for _, r, _ in rows])
            households = np.array([g for _, _, g in rows], dtype=np.float64)
            fit_sd = np.array([records[i]["answer_sd"][wid] for i, _, _ in rows], dtype=np.float64).reshape(released.shape)
            at = [nodes[i] for i, _, _ in rows]
            if depth == 1:
                for j, node in enumerate(at):
                    if (node[0], wid) in response:
                        fit_sd[j] = np.sqrt(fit_sd[j] ** 2 + response[(node[0], wid)])
                var_G = np.array([puma_var.get(node[0], 0.0) for node in at])
            else:
                var_G = np.array([total_var[node] for node in at])
            se = combine_total(released, households[:, None], fit_sd, var_G[:, None])
            codes, _ = cell_labels(wid, released.shape[1], parts.domain)
            out.append(_rows("marginal", "state" if depth == 1 else "puma", [records[i]["node"] for i, _, _ in rows], wid, codes, released,
                             intervals(released, se), method))
        return out

    nothing = np.zeros(0, dtype=np.int64)
    tables: list[pa.Table] = []
    done: set[int] = set()
    empty = None
    for part in parts:
        ids = [i for st in np.unique(part.geo[:, 0]).tolist() for i in by_state.get(st, [])]
        tables += answered(ids, part)
        done.update(ids)
        empty = part.take(nothing)
    missing = sorted(i for ids in by_state.values() for i in ids if i not in done)  # a state without released households
    if missing:
        if empty is None:
            raise ValueError("marginal intervals need at least one part of the release")
        tables += answered(missing, empty)
    return pa.concat_tables(tables) if tables else INTERVALS_SCHEMA.empty_table()


def intervals_table(*parts: pa.Table) -> pa.Table:
    """The parts in one table, sorted by table, node, marginal and cell."""
    t = pa.concat_tables([p.cast(INTERVALS_SCHEMA) for p in parts]) if parts else INTERVALS_SCHEMA.empty_table()
    return t.sort_by([("table", "ascending"), ("node", "ascending"), ("marginal", "ascending"), ("cell", "ascending")])


def manifest_entry(table: pa.Table) -> dict:
    return {
        "table": TABLE,
        "rows": table.num_rows,
        "replicates": BOOTSTRAP_REPLICATES,
        "table_semantics": "an error estimate beside every released answer of count_of_counts.parquet (parametric bootstrap "
                           "of the count-of-counts estimator from the stored noise, seeded from the sampling seed) and of every "
                           "workload measured by the synthesis at its node (the MAP update's error, its prior's error estimated by "
                           "empirical Bayes from the noisy answers): "
                           "released value, se, bias, 90 % interval; post-processing of the noisy measurements only",
    }
