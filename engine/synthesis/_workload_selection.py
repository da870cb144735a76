"""Data-dependent workload selection from PUBLIC data (no privacy cost).

Tao et al. (prior-aware distribution estimation), §4.2 "Workload W_S and W_G": "Given the public
dataset, we compute the pair-wise mutual information for all attributes, and convert it into a graph
by adding edges with high mutual information. We then select some cliques from the graph as the
workload W_S for the state-level data ... For data of each PUMA-YEAR group ... we select some one-way
marginal queries for the workload W_G such that those attributes are approximately independent
according to the public dataset."

Hierarchical version (H-GEM Table 1 queries):
- mutual information between every pair of attributes, measured where the pair lives:
  group × group over households, person × person over persons, and group × person over persons
  through the household–person join (the joint of a person's attribute and its household's
  attribute);
- the strong-pair graph: a maximum spanning tree of the MI graph (Kruskal, deterministic ties),
  plus every pair whose MI is at least ``edge_quantile`` of all pairs;
- state level: the strongest triangles of the strong graph (by the sum of their three MIs, within a
  cell cap), then every tree edge not covered by a chosen triangle; each clique becomes workloads by
  its attribute kinds — group only: a group-level partition; person only: a person-level marginal;
  mixed: a person-level marginal (the joint the MI was measured on) and a group-level "contains"
  workload (households of y_G containing a person of y_I), each within the cell cap;
- PUMA level: one-way marginals of the attributes whose distribution differs most between the PUMAs
  of a public state (the within-state MI of attribute and PUMA, :func:`geographic_information`: what a
  PUMA measurement adds to its state's posterior), greedily, skipping an attribute largely redundant
  with one already taken (normalised MI ≥ ``puma_redundancy_nmi``), plus a few small two-way
  "contains" marginals from the tree. Tao et al. took approximately independent attributes of
  highest entropy; on the ACS that picked SEX and the householder's sex, which barely vary between
  PUMAs, and left out the householder's age and education, which do. ``puma_max_attributes`` of
  them, ranked (:attr:`WorkloadSelection.puma_ranked`): the release takes four, or more where the
  PUMA level's budget carries them (:mod:`engine.synthesis._puma_attributes`, which keeps a prefix of the
  ranking, :meth:`WorkloadSelection.with_puma_attributes`).

Everything is a deterministic function of the public data and the parameters (ties broken by
attribute order), and :class:`WorkloadSelection` carries a JSON-serialisable explanation.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from engine.data import Domain, HierarchicalData, unique_rows
from engine.queries import Workload

PUMA_ATTRIBUTES = 4  # the PUMA level's one-way marginals by default (module docstring; six: benchmarks/results/HISTORY.md)
PUMA_ATTRIBUTES_MAX = 8  # the most a budget-driven choice may take (engine.synthesis._puma_attributes; eight lost to six at ε = 2)

# ---------------------------------------------------------------------------- mutual information


def _mi_from_counts(joint: np.ndarray) -> float:
    """Mutual information (nats) of a 2-D contingency table."""
    n = joint.sum()
    if n <= 0:
        return 0.0
    p = joint / n
    pa = p.sum(axis=1, keepdims=True)
    pb = p.sum(axis=0, keepdims=True)
    nz = p > 0
    return float(max(np.sum(p[nz] * np.log(p[nz] / (pa @ pb)[nz])), 0.0))


def _entropy(counts: np.ndarray) -> float:
    n = counts.sum()
    if n <= 0:
        return 0.0
    p = counts[counts > 0] / n
    return float(-np.sum(p * np.log(p)))


@dataclass(frozen=True)
class AttributeInfo:
    names: tuple[str, ...]          # group attributes first, then person attributes
    kinds: tuple[str, ...]          # "group" | "person"
    sizes: tuple[int, ...]
    entropy: np.ndarray             # (k,) nats, over households (group) or persons (person)
    mi: np.ndarray                  # (k, k) nats, symmetric, 0 on the diagonal


def attribute_columns(data: HierarchicalData) -> tuple[list[str], list[str], list[int], list[np.ndarray]]:
    d = data.domain
    names = [a.name for a in d.group] + [a.name for a in d.person]
    kinds = ["group"] * len(d.group) + ["person"] * len(d.person)
    sizes = [a.size for a in d.group] + [a.size for a in d.person]
    cols = [data.group[:, j].astype(np.int64) for j in range(len(d.group))] + [
        data.person[:, j].astype(np.int64) for j in range(len(d.person))
    ]
    return names, kinds, sizes, cols


def mutual_information(data: HierarchicalData) -> AttributeInfo:
    """Pairwise MI of all attributes: group×group over households, person×person over persons,
    group×person over persons through the household–person join. Vectorised (one bincount per pair)."""
    names, kinds, sizes, cols = attribute_columns(data)
    hh = data.person_household
    k = len(names)
    mi = np.zeros((k, k))
    ent = np.zeros(k)
    for i in range(k):
        ent[i] = _entropy(np.bincount(cols[i], minlength=sizes[i]).astype(float))
    for i, j in itertools.combinations(range(k), 2):
        a, b = cols[i], cols[j]
        if kinds[i] != kinds[j]:  # group × person: person-level join
            a = a[hh] if kinds[i] == "group" else a
            b = b[hh] if kinds[j] == "group" else b
        joint = np.bincount(a * sizes[j] + b, minlength=sizes[i] * sizes[j]).reshape(sizes[i], sizes[j])
        mi[i, j] = mi[j, i] = _mi_from_counts(joint.astype(float))
    return AttributeInfo(tuple(names), tuple(kinds), tuple(sizes), ent, mi)


def geographic_information(data: HierarchicalData) -> np.ndarray:
    """How much each attribute varies between the PUMAs of a state, in nats: the state-weighted mean
    of the mutual information between the attribute and the PUMA within each state (geography
    columns 0 and 1), over households for a group attribute and over persons for a person
    attribute, each state's plug-in estimate less its Miller–Madow bias (|A| − 1)(P − 1) / (2n)
    and floored at 0. This is the expected log-loss of answering a PUMA's marginal with its state's
    (the information a PUMA measurement can add to a state posterior). Zeros where the data have one
    PUMA per state."""
    names, kinds, sizes, cols = attribute_columns(data)
    nodes, node = unique_rows(data.geo[:, :2], return_inverse=True)
    node = node.reshape(-1).astype(np.int64)
    _, node_state = np.unique(nodes[:, 0], return_inverse=True)
    node_state = node_state.reshape(-1)
    # per level (households, persons): each node's unit count and each state's nodes, computed once
    level_node = {"group": node, "person": node[data.person_household]}
    level_n = {k: np.bincount(v, minlength=len(nodes)) for k, v in level_node.items()}
    states = [np.flatnonzero(node_state == s) for s in range(int(node_state.max()) + 1)] if len(nodes) else []
    out = np.zeros(len(names))
    for i in range(len(names)):
        g, n_node = level_node[kinds[i]], level_n[kinds[i]]
        joint = np.bincount(g * sizes[i] + cols[i], minlength=len(nodes) * sizes[i]).reshape(len(nodes), sizes[i]).astype(float)
        total = max(int(n_node.sum()), 1)
        for members in states:
            members = members[n_node[members] > 0]
            if members.size < 2:
                continue
            j = joint[members]
            n_s = float(j.sum())
            bias = (int((j.sum(axis=0) > 0).sum()) - 1) * (members.size - 1) / (2.0 * n_s)
            out[i] += n_s / total * max(_mi_from_counts(j) - bias, 0.0)
    return out


def normalised_mi(info: AttributeInfo) -> np.ndarray:
    """MI / min(H_i, H_j) ∈ [0, 1] (0 for a constant attribute)."""
    h = info.entropy
    den = np.minimum.outer(h, h)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(den > 0, info.mi / den, 0.0)
    np.fill_diagonal(out, 0.0)
    return np.clip(out, 0.0, 1.0)


# ------------------------------------------------------------------------------------- graph


def maximum_spanning_tree(weights: np.ndarray, allowed: np.ndarray | None = None) -> list[tuple[int, int]]:
    """Kruskal on a symmetric weight matrix; ties broken by (i, j); only ``allowed`` pairs used."""
    k = weights.shape[0]
    pairs = [(i, j) for i, j in itertools.combinations(range(k), 2) if allowed is None or allowed[i, j]]
    pairs.sort(key=lambda e: (-weights[e], e))
    parent = list(range(k))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    tree = []
    for i, j in pairs:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[ri] = rj
            tree.append((i, j))
    return tree


# ------------------------------------------------------------------------------ workloads


def clique_workloads(domain: Domain, attrs: tuple[str, ...], max_cells: int, contains: bool = True) -> list[Workload]:
    """Workloads for one clique (attribute names in domain order), by attribute kinds (module doc);
    a mixed clique gives the person-level joint and, when ``contains``, the group-level "contains"."""
    gnames = {a.name for a in domain.group}
    g = tuple(a for a in attrs if a in gnames)
    p = tuple(a for a in attrs if a not in gnames)
    if not p:
        cand = [Workload("group", g, ())]
    elif not g:
        cand = [Workload("person", (), p)]
    else:
        cand = [Workload("person", g, p)] + ([Workload("group", g, p)] if contains else [])
    return [w for w in cand if w.n_cells(domain) <= max_cells]


def pair_completion(domain: Domain, chosen: Sequence[Workload], max_cells: int) -> list[Workload]:
    """The two-way marginals of the persons that no person-level workload of ``chosen`` holds:
    every pair of person attributes, and the size attribute with every person attribute, each as a
    person-level workload within ``max_cells`` (domain order).

    The mutual-information graph keeps the pairs that are strong on the public data; a pair that is
    weak there is left to the prior, which for a private state unlike the public ones (New Mexico
    among the shared states) is the wrong answer: measured, the pair corrects it, and where the
    prior was right the MAP fit barely moves (``benchmarks/results/HISTORY.md``). It roughly
    doubles the state level's measured cells, and with them the cost of the state's final fit and
    of the dense algebra of its error estimates; the adaptive rounds' fits leave the completion out
    (``engine.synthesis._node.synthesize_node``) to keep that cost to the final fit."""
    held = [(set(w.group_attrs), set(w.person_attrs)) for w in chosen if w.level == "person"]
    names = [a.name for a in domain.person]
    out = [Workload("person", (), pair) for pair in itertools.combinations(names, 2)
           if not any(set(pair) <= p for _, p in held)]
    size = domain.size_attribute
    out += [Workload("person", (size,), (a,)) for a in names if not any(size in g and a in p for g, p in held)]
    return [w for w in out if w.n_cells(domain) <= max_cells]


@dataclass
class WorkloadSelection:
    """``state`` and ``puma``: the two levels' workloads; ``explanation``: why (JSON); ``puma_ranked``:
    the PUMA level's one-way marginals best first (a prefix of them is in ``puma``, see
    :meth:`with_puma_attributes`); ``completed``: the workloads of ``state`` that the pair
    completion added (:func:`pair_completion`)."""

    state: list[Workload]
    puma: list[Workload]
    explanation: dict[str, Any]
    puma_ranked: list[Workload] = field(default_factory=list)
    completed: list[Workload] = field(default_factory=list)

    def all(self) -> list[Workload]:
        return list(dict.fromkeys(self.state + self.puma))

    def with_puma_attributes(self, count: int) -> WorkloadSelection:
        """The same selection measuring only the first ``count`` ranked PUMA one-way marginals
        (the pairs kept): what :func:`select_workloads` gives with ``puma_max_attributes=count``."""
        if not 0 <= count <= len(self.puma_ranked):
            raise ValueError(f"the selection ranks {len(self.puma_ranked)} PUMA attributes; cannot keep {count}")
        dropped = set(self.puma_ranked[count:])
        puma = [w for w in self.puma if w not in dropped]
        kept_ids = {w.id for w in puma}
        e = self.explanation
        keep = set(e["puma_attribute_ranking"][:count])
        explanation = {**e, "params": {**e["params"], "puma_max_attributes": count},
                       "puma_attributes": [a for a in e["puma_attributes"] if a in keep],
                       "puma_workloads": [x for x in e["puma_workloads"] if x["id"] in kept_ids]}
        return replace(self, puma=puma, explanation=explanation)

    def to_record(self) -> dict[str, Any]:
        """JSON form (workload ids), read back by :meth:`from_record`."""
        return {"state": [w.id for w in self.state], "puma": [w.id for w in self.puma], "puma_ranked": [w.id for w in self.puma_ranked],
                "completed": [w.id for w in self.completed], "explanation": self.explanation}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> WorkloadSelection:
        def ids(key: str) -> list[Workload]:
            return [Workload.from_id(i) for i in record.get(key, [])]

        return cls(ids("state"), ids("puma"), record["explanation"], ids("puma_ranked"), ids("completed"))


def select_workloads(
    public: HierarchicalData,
    *,
    state_max_cells: int = 256,
    n_triangles: int = 4,
    max_contains: int = 4,
    edge_quantile: float = 0.75,
    puma_redundancy_nmi: float = 0.5,
    puma_max_attributes: int = PUMA_ATTRIBUTES,
    puma_pairs: int = 2,
    puma_pair_max_cells: int = 16,
    person_first: int = 0,
    normalise: bool = False,
    puma_exclude: Sequence[str] = (),
    complete_pairs: bool = False,
) -> WorkloadSelection:
    """State- and PUMA-level workloads from the public data (Tao et al. §4.2, see module doc).

    ``state_max_cells`` caps |dom S| of every state-level workload; ``n_triangles`` strongest
    triangles are taken (those whose workloads would all exceed the cap are skipped);
    a triangle must bring at least two pairs not covered by earlier ones (diversity); at most
    ``max_contains`` group-level "contains" workloads are made from mixed cliques (strongest first;
    further mixed cliques give the person-level joint only); ``edge_quantile`` sets the strong-graph
    threshold (in addition to the spanning tree).
    PUMA: up to ``puma_max_attributes`` one-way marginals of the attributes that vary most between
    the PUMAs of a public state (:func:`geographic_information`; ties and attributes without such
    variation by entropy), skipping one whose normalised MI with an attribute already taken is
    ``puma_redundancy_nmi`` or more (it would mostly repeat that measurement), and ``puma_pairs``
    two-way group-level "contains" (or, without a mixed edge, other) workloads from tree edges with
    at most ``puma_pair_max_cells`` cells; ``puma_exclude``: attributes never taken as PUMA one-way
    marginals (the size attribute where the count-of-counts stage measures every PUMA's size
    histogram already).
    ``complete_pairs``: the state level also measures every two-way marginal of the persons that no
    chosen person-level workload holds — each pair of person attributes, and the size attribute
    with each person attribute — as its own person-level workload (:func:`pair_completion`).
    ``person_first``: person-level workloads count only the first ``person_first`` persons of each
    household (``Workload.first``: sensitivity ``person_first`` instead of M under the household
    unit); 0 counts every person. ``normalise``: every workload but the partitions is measured
    with each household's contribution normalised to one household's worth in L2
    (``Workload.normalised``).
    """
    d = public.domain
    info = mutual_information(public)
    names, kinds, sizes = info.names, info.kinds, info.sizes
    k = len(names)
    mi = info.mi
    cells2 = np.multiply.outer(np.array(sizes), np.array(sizes))
    pair_ok = cells2 <= state_max_cells

    tree = maximum_spanning_tree(mi, pair_ok)
    upper = mi[np.triu_indices(k, 1)]
    thr = float(np.quantile(upper, edge_quantile)) if upper.size else 0.0
    strong = np.zeros((k, k), bool)
    for i, j in tree:
        strong[i, j] = strong[j, i] = True
    strong |= (mi >= thr) & pair_ok
    np.fill_diagonal(strong, False)

    # strongest triangles of the strong graph
    tri_scored = []
    for a, b, c in itertools.combinations(range(k), 3):
        if strong[a, b] and strong[a, c] and strong[b, c]:
            tri_scored.append((-(mi[a, b] + mi[a, c] + mi[b, c]), (a, b, c)))
    tri_scored.sort()
    chosen_tri: list[tuple[int, int, int]] = []
    state: list[Workload] = []
    n_contains = 0
    covered: set[frozenset[int]] = set()
    for _, t in tri_scored:
        if len(chosen_tri) >= n_triangles:
            break
        edges = {frozenset(e) for e in itertools.combinations(t, 2)}
        if len(edges - covered) < 2:  # diversity: a triangle must bring at least two new pairs
            continue
        ws = clique_workloads(d, tuple(names[x] for x in t), state_max_cells, contains=n_contains < max_contains)
        if not ws:
            continue
        n_contains += sum(w.level == "group" and bool(w.person_attrs) for w in ws)
        chosen_tri.append(t)
        covered |= edges
        state.extend(ws)
    tree_added = []
    for i, j in tree:  # tree edges come strongest first
        if frozenset((i, j)) in covered:
            continue
        ws = clique_workloads(d, (names[i], names[j]), state_max_cells, contains=n_contains < max_contains)
        if ws:
            n_contains += sum(w.level == "group" and bool(w.person_attrs) for w in ws)
            tree_added.append((i, j))
            state.extend(ws)
    # at least one group-level "contains" workload (S_G and S_I both non-empty): the strongest
    # group × person pair within the cap, if the cliques gave none
    forced_contains = None
    if not any(w.level == "group" and w.group_attrs and w.person_attrs for w in state):
        mixed = [(i, j) for i, j in itertools.combinations(range(k), 2) if kinds[i] != kinds[j] and pair_ok[i, j]]
        if mixed:
            i, j = min(mixed, key=lambda e: (-mi[e], e))
            forced_contains = (i, j)
            state.extend(clique_workloads(d, (names[i], names[j]), state_max_cells))
    state = list(dict.fromkeys(state))
    completed = pair_completion(d, state, state_max_cells) if complete_pairs else []
    state += completed

    # PUMA level: 1-way marginals of the attributes that vary most between PUMAs, not redundant
    nmi = normalised_mi(info)
    geo_mi = geographic_information(public)
    order = sorted(range(k), key=lambda i: (-round(float(geo_mi[i]), 12), -info.entropy[i], i))
    indep: list[int] = []
    for i in order:
        if len(indep) >= puma_max_attributes:
            break
        if info.entropy[i] <= 0 or names[i] in puma_exclude:
            continue
        if all(nmi[i, j] < puma_redundancy_nmi for j in indep):
            indep.append(i)
    def one_way(i: int) -> Workload:
        return Workload("group", (names[i],), ()) if kinds[i] == "group" else Workload("person", (), (names[i],))

    ranked = [one_way(i) for i in indep]
    puma: list[Workload] = [one_way(i) for i in sorted(indep)]
    small_edges = sorted(
        (e for e in tree if cells2[e] <= puma_pair_max_cells), key=lambda e: (kinds[e[0]] == kinds[e[1]], -mi[e], e)
    )
    puma_pairs_used = []
    for i, j in small_edges[:puma_pairs]:
        if kinds[i] != kinds[j]:
            gi, pi = (i, j) if kinds[i] == "group" else (j, i)
            w = Workload("group", (names[gi],), (names[pi],))
        elif kinds[i] == "group":
            w = Workload("group", (names[i], names[j]), ())
        else:
            w = Workload("person", (), (names[i], names[j]))
        puma.append(w)
        puma_pairs_used.append((i, j))
    puma = list(dict.fromkeys(puma))
    if person_first or normalise:
        def form(w: Workload) -> Workload:
            return w if w.is_partition() else Workload(w.level, w.group_attrs, w.person_attrs,
                                                       person_first if w.level == "person" else 0, normalise)
        state, puma, ranked, completed = [form(w) for w in state], [form(w) for w in puma], [form(w) for w in ranked], [form(w) for w in completed]

    def pair_name(e: tuple[int, int]) -> str:
        return f"{names[e[0]]}~{names[e[1]]}"

    explanation = {
        "method": "Tao et al. 2021 §4.2: pairwise mutual information on public data; state = strong cliques, "
        "PUMA = one-way marginals of the attributes that vary most between a public state's PUMAs, not redundant (+ small pairs)",
        "public_households": public.n_households,
        "public_persons": public.n_persons,
        "attributes": [{"name": n, "kind": kd, "size": s, "entropy_nats": round(float(h), 6)}
                       for n, kd, s, h in zip(names, kinds, sizes, info.entropy)],
        "mutual_information_nats": {
            pair_name((i, j)): round(float(mi[i, j]), 6) for i, j in itertools.combinations(range(k), 2)
        },
        "params": {
            "state_max_cells": state_max_cells, "n_triangles": n_triangles, "max_contains": max_contains, "edge_quantile": edge_quantile,
            "strong_edge_threshold_nats": round(thr, 6), "puma_redundancy_nmi": puma_redundancy_nmi,
            "puma_max_attributes": puma_max_attributes, "puma_pairs": puma_pairs,
            "puma_pair_max_cells": puma_pair_max_cells, "person_first": person_first,
            "normalise": normalise, "puma_exclude": list(puma_exclude), "complete_pairs": complete_pairs,
        },
        "spanning_tree_edges": [pair_name(e) for e in tree],
        "strong_edges": [pair_name((i, j)) for i, j in itertools.combinations(range(k), 2) if strong[i, j]],
        "triangles": [[names[x] for x in t] for t in chosen_tri],
        "tree_edges_added": [pair_name(e) for e in tree_added],
        "forced_contains_pair": pair_name(forced_contains) if forced_contains else None,
        "completed_pairs": ["~".join(w.group_attrs + w.person_attrs) for w in completed],
        "geographic_information_nats": {n: round(float(v), 6) for n, v in zip(names, geo_mi)},
        "puma_attributes": [names[i] for i in sorted(indep)],
        "puma_attribute_ranking": [names[i] for i in indep],
        "puma_pairs": [pair_name(e) for e in puma_pairs_used],
        "state_workloads": [{"id": w.id, "cells": w.n_cells(d)} for w in state],
        "puma_workloads": [{"id": w.id, "cells": w.n_cells(d)} for w in puma],
    }
    return WorkloadSelection(state, puma, explanation, ranked, completed)
