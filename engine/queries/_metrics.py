"""Accuracy metrics of a synthetic dataset against the (confidential) truth, as in the papers.

- Hierarchical k-way query error (H-GEM paper, Figure 1): for every geography node of a level and
  every workload, the normalised answers (group level / N_G of the node, person level / N_I of the
  node) of the synthetic and the true data; the max and the mean absolute error over all cells
  and workloads, averaged over the nodes of the level.
- Average L1 distance of random 2-way marginals per node (NIST 2020 Temporal Map Challenge, used
  by the prior-update paper): person records joined with their household's attributes; for each
  node, the mean over random attribute pairs of ‖p_true − p_synth‖₁ ∈ [0, 2].

These numbers are computed against confidential data: internal QA and benchmarks only.
"""

from __future__ import annotations

import itertools
from typing import Any, cast

import numpy as np

from engine.data import Domain, HierarchicalData, unique_rows
from engine.queries._queries import Level, Workload, counted_person_cells, household_cell_pairs


def node_index(data: HierarchicalData, level: str, nodes: np.ndarray) -> np.ndarray:
    """Index (into ``nodes``, rows of geography codes down to ``level``) of every household; -1 if absent."""
    k = data.domain.geography.index(level) + 1
    geo = data.geo[:, :k].astype(np.int64)
    if len(nodes) == 0:
        return np.full(len(geo), -1)
    # numpy's stubs pick the scalar overload for a 2-D array argument; these are 1-D arrays
    key_nodes = cast(np.ndarray, np.ravel_multi_index(nodes.T.astype(np.int64), [1 << 17] * k))
    key = cast(np.ndarray, np.ravel_multi_index(geo.T, [1 << 17] * k))
    order = np.argsort(key_nodes)
    pos = np.searchsorted(key_nodes[order], key)
    pos = np.clip(pos, 0, len(order) - 1)
    hit = key_nodes[order][pos] == key
    return np.where(hit, order[pos], -1)


def answers_by_node(data: HierarchicalData, w: Workload, level: str, nodes: np.ndarray) -> np.ndarray:
    """(n_nodes, n_cells) normalised answers of ``w`` within every node (rows of zeros for empty nodes)."""
    return _by_node(data, w, _cell_pairs(data, w), node_index(data, level, nodes), len(nodes))


def counts_by_node(data: HierarchicalData, w: Workload, level: str, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((n_nodes, n_cells) counts of ``w`` within every node, each node's denominator: its
    households for a group-level workload, its persons for a person-level one)."""
    return _node_counts(data, w, _cell_pairs(data, w), node_index(data, level, nodes), len(nodes))


def _cell_pairs(data: HierarchicalData, w: Workload) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(household, cell, count) entries whose sums per node and cell are the workload's counts: a
    person-level workload's counted persons one by one (no need to merge them per household;
    a normalised workload's entries are per household). Count None: every entry counts one (no
    count array converted and multiplied per entry, on millions of persons at national size)."""
    if w.level == "person" and not w.normalised:
        hh, cells = counted_person_cells(data, w)
        return hh, cells, None
    return household_cell_pairs(data, w)


def _by_node(data: HierarchicalData, w: Workload, pairs: tuple[np.ndarray, np.ndarray, np.ndarray | None], node: np.ndarray,
             n_nodes: int) -> np.ndarray:
    """:func:`answers_by_node` from the workload's (household, cell, count) ``pairs`` and every
    household's ``node`` index: the pairs serve every level."""
    counts, denom = _node_counts(data, w, pairs, node, n_nodes)
    shares: np.ndarray = counts / np.maximum(denom, 1.0)[:, None]
    return shares


def _node_counts(data: HierarchicalData, w: Workload, pairs: tuple[np.ndarray, np.ndarray, np.ndarray | None], node: np.ndarray,
                 n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`counts_by_node` from the workload's ``pairs`` and every household's ``node`` index."""
    return _tally(data, w, pairs, node, n_nodes), _denominators(data, w.level, node, n_nodes)


def _tally(data: HierarchicalData, w: Workload, pairs: tuple[np.ndarray, np.ndarray, np.ndarray | None], node: np.ndarray,
           n_nodes: int) -> np.ndarray:
    """(n_nodes, n_cells) counts of ``w`` within every node, from its ``pairs``."""
    n_cells = w.n_cells(data.domain)
    h, c, k = pairs
    at = node[h]
    ok = at >= 0
    if not ok.all():  # households outside every node of the level
        at, c, k = at[ok], c[ok], None if k is None else k[ok]
    tally = np.bincount(at * n_cells + c, weights=None if k is None else k.astype(np.float64), minlength=n_nodes * n_cells)
    counts: np.ndarray = tally.astype(np.float64, copy=False).reshape(n_nodes, n_cells)
    return counts


def _denominators(data: HierarchicalData, level: Level, node: np.ndarray, n_nodes: int) -> np.ndarray:
    """Every node's denominator of a workload of ``level``: its households (group level) or persons."""
    valid = node >= 0
    unit = np.ones(data.n_households) if level == "group" else data.sizes.astype(np.float64)
    denominators: np.ndarray = np.bincount(node[valid], weights=unit[valid], minlength=n_nodes)
    return denominators


def query_errors(true: HierarchicalData, synth: HierarchicalData, workloads: list[Workload], level: str) -> dict[str, Any]:
    """Max and mean absolute error of normalised answers per node of ``level``, averaged over nodes."""
    return query_errors_by_level(true, {"synth": synth}, workloads, [level])["synth"][level]


def query_errors_by_level(true: HierarchicalData, candidates: dict[str, HierarchicalData], workloads: list[Workload],
                          levels: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{candidate: {level: :func:`query_errors`}} for several synthetic datasets and geography
    levels at once: each dataset's cells of a workload are found once and counted once, at the
    finest level; a coarser level's counts are its nodes' sums (:func:`_nested_counts`)."""
    geography = true.domain.geography
    levels_fine_last = sorted(levels, key=geography.index)
    nodes = {lv: unique_rows(true.geo[:, : geography.index(lv) + 1]) for lv in levels}
    true_node = {lv: node_index(true, lv, nodes[lv]) for lv in levels}
    synth_node = {name: {lv: node_index(synth, lv, nodes[lv]) for lv in levels} for name, synth in candidates.items()}
    max_err = {name: {lv: np.zeros(len(nodes[lv])) for lv in levels} for name in candidates}
    sum_err = {name: {lv: np.zeros(len(nodes[lv])) for lv in levels} for name in candidates}
    # a node's denominator depends on the workload's level only: counted once per dataset and level, not per workload
    denominators: dict[tuple[str | None, Level], dict[str, np.ndarray]] = {}

    def denominator(name: str | None, data: HierarchicalData, node: dict[str, np.ndarray], level: Level) -> dict[str, np.ndarray]:
        if (name, level) not in denominators:
            denominators[(name, level)] = {lv: _denominators(data, level, node[lv], len(nodes[lv])) for lv in levels}
        return denominators[(name, level)]

    n_cells = 0
    for w in workloads:
        truth = _answers(_nested_counts(true, w, _cell_pairs(true, w), true_node, nodes, levels_fine_last),
                         denominator(None, true, true_node, w.level))
        for name, synth in candidates.items():
            synth_answers = _answers(_nested_counts(synth, w, _cell_pairs(synth, w), synth_node[name], nodes, levels_fine_last),
                                     denominator(name, synth, synth_node[name], w.level))
            for lv in levels:
                diff = np.abs(truth[lv] - synth_answers[lv])
                max_err[name][lv] = np.maximum(max_err[name][lv], diff.max(axis=1))
                sum_err[name][lv] += diff.sum(axis=1)
        n_cells += w.n_cells(true.domain)
    return {name: {lv: {"level": lv, "n_nodes": int(len(nodes[lv])), "n_workloads": len(workloads),
                        "max_error": float(max_err[name][lv].mean()),
                        "mean_error": float((sum_err[name][lv] / max(n_cells, 1)).mean())} for lv in levels}
            for name in candidates}


def _answers(counts: dict[str, np.ndarray], denominators: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {lv: c / np.maximum(denominators[lv], 1.0)[:, None] for lv, c in counts.items()}


def _nested_counts(data: HierarchicalData, w: Workload, pairs: tuple[np.ndarray, np.ndarray, np.ndarray | None],
                   node: dict[str, np.ndarray], nodes: dict[str, np.ndarray], levels: list[str]) -> dict[str, np.ndarray]:
    """:func:`_tally` at every level (``levels`` coarse to fine): counted from the pairs at the
    finest level only, a coarser level summing its nodes' rows (the finest nodes are sorted, so each
    coarser node's are contiguous). A level is counted from the pairs where that would differ: when
    some household has a node at it but none at the finest level."""
    fine = levels[-1]
    out = {fine: _tally(data, w, pairs, node[fine], len(nodes[fine]))}
    for lv in levels[:-1]:
        k = nodes[lv].shape[1]
        prefixes, parent = unique_rows(nodes[fine][:, :k], return_inverse=True)
        if not np.array_equal(prefixes, nodes[lv]) or np.any((node[fine] < 0) & (node[lv] >= 0)):
            out[lv] = _tally(data, w, pairs, node[lv], len(nodes[lv]))
            continue
        starts = np.searchsorted(parent.reshape(-1), np.arange(len(nodes[lv])))
        out[lv] = np.add.reduceat(out[fine], starts, axis=0)
    return out


def k_way_workloads(domain: Domain, k: int = 3, level: Level = "group", limit: int | None = None, rng: np.random.Generator | None = None) -> list[Workload]:
    """All (or ``limit`` random) workloads of k attributes (group and person attributes mixed;
    person level needs at least one person attribute)."""
    g = [a.name for a in domain.group]
    p = [a.name for a in domain.person]
    out = []
    for combo in itertools.combinations(g + p, k):
        ga = tuple(a for a in combo if a in g)
        pa = tuple(a for a in combo if a in p)
        if level == "person" and not pa:
            continue
        out.append(Workload(level, ga, pa))
    if limit is not None and len(out) > limit:
        rng = rng or np.random.default_rng(0)
        out = [out[i] for i in sorted(rng.choice(len(out), limit, replace=False))]
    return out


def person_column(data: HierarchicalData, attribute: int) -> np.ndarray:
    """Every person's code of one attribute of the person records joined with their household's:
    index < k_G a household attribute, else a person attribute (one column at a time: the joined
    table of every attribute would hold N_I × (k_G + k_I) integers)."""
    k_g = len(data.domain.group_sizes)
    if attribute < k_g:
        column: np.ndarray = data.group[:, attribute].astype(np.int64)[data.person_household]
        return column
    return data.person[:, attribute - k_g].astype(np.int64)


def two_way_l1(true: HierarchicalData, synth: HierarchicalData, level: str = "puma", n_pairs: int = 50, rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Average L1 distance of ``n_pairs`` random 2-way marginals per node (NIST metric), averaged over nodes."""
    return two_way_l1_by_candidate(true, {"synth": synth}, level, n_pairs, rng)["synth"]


def two_way_l1_by_candidate(true: HierarchicalData, candidates: dict[str, HierarchicalData], level: str = "puma", n_pairs: int = 50,
                            rng: np.random.Generator | None = None) -> dict[str, dict[str, Any]]:
    """:func:`two_way_l1` of every candidate on the same ``n_pairs`` pairs, the true marginals
    computed once per pair for all of them."""
    rng = rng or np.random.default_rng(0)
    k = true.domain.geography.index(level) + 1
    nodes = unique_rows(true.geo[:, :k])
    sizes = list(true.domain.group_sizes) + list(true.domain.person_sizes)
    n_attr = len(sizes)
    pairs = [tuple(rng.choice(n_attr, 2, replace=False)) for _ in range(n_pairs)]

    def located(data: HierarchicalData) -> tuple[np.ndarray, np.ndarray | None]:  # each person's node (int32), and which persons lie in the nodes
        node = node_index(data, level, nodes)[data.person_household]
        ok = node >= 0
        return (node.astype(np.int32), None) if ok.all() else (node[ok].astype(np.int32), ok)

    def marg(data: HierarchicalData, where: tuple[np.ndarray, np.ndarray | None], a: int, b: int) -> np.ndarray:
        node, ok = where
        m = sizes[a] * sizes[b]
        cell = person_column(data, a).astype(np.int32) * sizes[b] + person_column(data, b).astype(np.int32)
        flat = node * m + (cell if ok is None else cell[ok])
        counts = np.bincount(flat, minlength=len(nodes) * m).reshape(len(nodes), m).astype(np.float64)
        shares: np.ndarray = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
        return shares

    t_where = located(true)
    s_where = {name: located(synth) for name, synth in candidates.items()}
    per_node = {name: np.zeros(len(nodes)) for name in candidates}
    for a, b in pairs:
        t = marg(true, t_where, a, b)
        for name, synth in candidates.items():
            per_node[name] += np.abs(t - marg(synth, s_where[name], a, b)).sum(axis=1)
    return {name: {"level": level, "n_nodes": int(len(nodes)), "n_pairs": n_pairs, "mean_l1": float(e.mean() / len(pairs)),
                   "max_l1": float(e.max() / len(pairs))} for name, e in per_node.items()}
