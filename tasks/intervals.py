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
  the node's diagnostics, :func:`engine.synthesis.fit_answer_sd`); each state's rows are written
  by its PUMA task (:func:`write_state_intervals`), where its households were drawn, and publish
  reads them back (:func:`read_state_intervals`).

Rows are sorted by table, node, marginal and cell: a replay writes the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from engine.count_of_counts import fit_histograms, fit_household_counts, geography_hierarchy
from engine.data import LEVELS, Domain, HierarchicalData, node_households, parse_node_key
from engine.privacy import MeasurementRecord as Measurement
from engine.privacy import write_atomic
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

__all__ = ["TABLE", "count_of_counts_intervals", "intervals_table", "manifest_entry", "read_state_intervals", "state_marginal_intervals",
           "uncertainty_rng", "write_state_intervals"]

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


def state_marginal_intervals(records: list[dict], data: HierarchicalData, method: str = "map_eb") -> pa.Table:
    """Rows for the measured marginals of one state: ``records`` its synthesis results (the state
    fit's ``.json``, when it has one, then its PUMAs', in node order; each with ``answer_sd`` and
    ``total_var``, results of older runs without them skipped), ``data`` the state's released
    households. Every measured workload's cells answered by the released microdata of that node,
    ± Z90 sd, each workload once on the state's households, per PUMA (a state's answer is its
    PUMAs' sum: integer counts, exact). The sd combines the fit's at a fixed total with the
    released total's variance (:func:`engine.synthesis.combine_total`): a PUMA's own fitted total;
    for the state, whose released answer is the sum of its PUMAs', the sum of its PUMAs' total
    variances (they were fitted independently), not the state fit's, and the state fit's sd is
    widened by the sum of its PUMA fits' responses to their own noise on the state's workloads
    (``response_sd``, :func:`engine.synthesis._uncertainty.response_count_sd`). The state's size
    histogram is left to the count-of-counts rows: the sum of its PUMAs' fitted sizes follows the
    PUMAs' count-of-counts histograms, i.e. the state's count-of-counts estimate, more than the
    state fit. One table per level and workload."""
    nodes = [parse_node_key(r["node"]) for r in records]
    states = {n[0] for n in nodes} | set(np.unique(data.geo[:, 0]).tolist())
    if len(states) > 1:
        raise ValueError(f"state_marginal_intervals takes the records and households of one state, not of states {sorted(states)}")
    response: dict[str, np.ndarray] = {}  # workload id: Σ over the PUMAs of the response variance
    for r in records:
        for wid, sd in (r.get("response_sd") or {}).items():
            response[wid] = response.get(wid, 0.0) + np.asarray(sd) ** 2
    puma_var = sum(float(r.get("total_var", 0.0)) for n, r in zip(nodes, records) if len(n) == 2)
    size_id = Workload("group", (data.domain.size_attribute,), ()).id
    pumas = node_households(data.geo, 2)
    position = {node: j for j, node in enumerate(sorted(pumas))}
    node_of = np.empty(data.n_households, dtype=np.int64)
    for node, j in position.items():
        node_of[pumas[node]] = j
    sizes = np.bincount(node_of, minlength=len(position))
    mine = [i for i, r in enumerate(records) if r.get("answer_sd")]
    found: dict[tuple[int, str], list[tuple[int, np.ndarray, int]]] = {}  # (depth, wid): (record, released, households)
    for wid in sorted({wid for i in mine for wid in records[i]["answer_sd"]}):
        M = node_answers(data, Workload.from_id(wid), node_of, len(position))
        for i in mine:
            node = nodes[i]
            if wid not in records[i]["answer_sd"] or (len(node) == 1 and wid == size_id):
                continue  # a state's released sizes are its PUMAs' sum, which tracks the count-of-counts estimate
            if len(node) == 1:
                got = (M.sum(axis=0), data.n_households)
            else:
                row = position.get(node)
                got = (np.zeros(M.shape[1]), 0) if row is None else (M[row], int(sizes[row]))
            found.setdefault((len(node), wid), []).append((i, *got))
    out = []
    for (depth, wid), rows in sorted(found.items()):
        released = np.stack([r for _, r, _ in rows])
        households = np.array([g for _, _, g in rows], dtype=np.float64)
        fit_sd = np.array([records[i]["answer_sd"][wid] for i, _, _ in rows], dtype=np.float64).reshape(released.shape)
        if depth == 1:
            if wid in response:
                fit_sd = np.sqrt(fit_sd**2 + response[wid])
            var_G = np.full(len(rows), puma_var)
        else:
            var_G = np.array([float(records[i].get("total_var", 0.0)) for i, _, _ in rows])
        se = combine_total(released, households[:, None], fit_sd, var_G[:, None])
        codes, _ = cell_labels(wid, released.shape[1], data.domain)
        out.append(_rows("marginal", "state" if depth == 1 else "puma", [records[i]["node"] for i, _, _ in rows], wid, codes, released,
                         intervals(released, se), method))
    return pa.concat_tables(out) if out else INTERVALS_SCHEMA.empty_table()


def write_state_intervals(path: Path, state_record: Path | None, node_files: Iterable[str | Path], method: str = "map_eb") -> None:
    """:func:`state_marginal_intervals` of one state's persisted results, written (atomically) as
    a Parquet part at ``path``: its PUMAs' ``node_files`` (their households and, beside each, its
    ``.json``) and its state fit's ``.json`` ``state_record`` (None, or a file that does not exist:
    no state fit, as under H-GEM)."""
    files = sorted(str(f) for f in node_files)
    records = [json.loads(Path(f).with_suffix(".json").read_text()) for f in files]
    if state_record is not None and state_record.exists():
        records.insert(0, json.loads(state_record.read_text()))
    table = state_marginal_intervals(records, HierarchicalData.concat([HierarchicalData.from_npz(f) for f in files]), method)
    write_atomic(path, lambda f: pq.write_table(table, f))


def read_state_intervals(paths: Iterable[Path]) -> pa.Table:
    """The measured marginals' rows of the release: the states' parts (:func:`write_state_intervals`) in one table."""
    parts = []
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"{p}: the state's interval rows are missing (its PUMA task writes them with its households)")
        parts.append(pq.read_table(p).cast(INTERVALS_SCHEMA))
    return pa.concat_tables(parts) if parts else INTERVALS_SCHEMA.empty_table()


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
