"""Accuracy benchmark for hierarchical count-of-counts (Kuo et al., VLDB 2018, Section 6.2).

``evaluate(histograms_by_level, epsilons, runs, parent_map=...)`` reports, per level, the
mean earth mover's distance per node (never aggregated across levels) of:

- per-node independent estimators: naive, Hg, Hc (no consistency);
- consistent variants for the Hc and Hg bases: leaves-only aggregated, top-down with the
  plain-average merge, top-down with the inverse-variance (weighted) merge;

averaged over ``runs`` repetitions, with the standard error (empirical std / sqrt(runs)).
The total epsilon is split evenly over the levels (sequential composition).

Input: ``{level: {node_key: H}}`` with H the exact household-size histogram of the node
(index = size), and ``parent_map`` ``{node_key: parent_key or None}``. By default the 12-state
ACS 2018 data (``acs()``); ``--synthetic`` runs a self-contained synthetic hierarchy.

    .venv/bin/python benchmarks/count_of_counts_accuracy.py            # 12 states, eps 0.1 0.5 1 2, 10 runs

Noise comes from ``double_geometric`` below: BENCHMARK-ONLY, NOT FOR RELEASES.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine.count_of_counts import Hierarchy, emd_batch, hierarchy_queries, run_hierarchy  # noqa: E402

VARIANTS = [
    ("naive", "naive", "none"),
    ("Hg", "hg", "none"),
    ("Hc", "hc", "none"),
    ("Hg leaves-only", "hg", "leaves"),
    ("Hg top-down avg", "hg", "average"),
    ("Hg top-down weighted", "hg", "weighted"),
    ("Hc leaves-only", "hc", "leaves"),
    ("Hc top-down avg", "hc", "average"),
    ("Hc top-down weighted", "hc", "weighted"),
]


def double_geometric(x, scale, rng):
    """x + discrete Laplace(scale) noise.  BENCHMARK-ONLY sampler, not for releases."""
    x = np.asarray(x)
    p = 1.0 - np.exp(-1.0 / scale)
    return x + rng.geometric(p, x.shape) - rng.geometric(p, x.shape)


def _assemble(histograms_by_level, parent_map, K):
    if parent_map is None:
        levels = sorted(histograms_by_level)
        if len(histograms_by_level[levels[0]]) != 1:
            raise ValueError("parent_map is required")
        raise ValueError("parent_map is required (node -> parent key)")
    h = Hierarchy.from_parent_map(parent_map)
    if K is None:
        K = max(len(np.trim_zeros(np.asarray(H), "b")) - 1 for lv in histograms_by_level for H in histograms_by_level[lv].values())
        K = max(K, 1)
    H = np.zeros((h.n_nodes, K + 1), np.int64)
    for _, nodes in histograms_by_level.items():
        for key, hist in nodes.items():
            hist = np.asarray(hist, dtype=np.int64)
            row = np.zeros(K + 1, np.int64)
            row[: min(hist.size, K + 1)] = hist[: K + 1]
            row[K] += hist[K + 1 :].sum()
            H[h.index[key]] = row
    agg = h.aggregate_up(np.where(h.is_leaf()[:, None], H, 0))
    if not np.array_equal(agg, H):
        raise ValueError("input histograms are not consistent (children must sum to parents)")
    return h, H, K


def evaluate(histograms_by_level, epsilons, runs: int = 5, *, parent_map=None, K=None, seed: int = 0,
             variants=VARIANTS, verbose: bool = True):
    """Mean EMD per node at each level, for every variant and total epsilon.

    Returns ``{eps: {variant: {level: (mean, standard_error)}}}``.  K (public cap) defaults
    to the largest size present (treated as public here)."""
    h, H, K = _assemble(histograms_by_level, parent_map, K)
    L = h.n_levels
    G = H.sum(1)
    rng = np.random.default_rng(seed)
    queries = {m: hierarchy_queries(h, H, K, m, unit="person") for m in {v[1] for v in variants}}
    results = {}
    for eps in np.atleast_1d(epsilons):
        eps_lv = [float(eps) / L] * L
        errs = {name: np.zeros((runs, L)) for name, _, _ in variants}
        for r in range(runs):
            noisy = {}
            for m, q in queries.items():
                noisy[m] = {
                    lv: [double_geometric(v, 1 / eps_lv[lv], rng) for v in q[lv].values]
                    if m == "hg"
                    else double_geometric(q[lv].values, q[lv].l1_sensitivity / eps_lv[lv], rng)
                    for lv in range(L)
                }
            for name, m, cons in variants:
                # Laplace of scale Δ/ε per entry: variance 2Δ²/ε² (Hg: Δ = 1)
                var_lv = [2.0 * ((1 if m == "hg" else queries[m][lv].l1_sensitivity) / eps_lv[lv]) ** 2 for lv in range(L)]
                out = run_hierarchy(h, noisy[m], var_lv, K=K, group_counts=G, method=m, consistency=cons).histograms
                e = emd_batch(H, out)
                errs[name][r] = [e[h.level_range(lv)].mean() for lv in range(L)]
        res = {
            name: {lv: (float(a[:, lv].mean()), float(a[:, lv].std(ddof=1) / np.sqrt(runs)) if runs > 1 else float("nan"))
                   for lv in range(L)}
            for name, a in errs.items()
        }
        results[float(eps)] = res
        if verbose:
            print(f"\n== total epsilon {eps:g} ({runs} runs; mean EMD per node ± s.e.)")
            print(f"  {'variant':24s}" + "".join(f"{'level ' + str(lv):>22s}" for lv in range(L)))
            for name, _, _ in variants:
                print(f"  {name:24s}" + "".join(f"{res[name][lv][0]:>13.1f} ± {res[name][lv][1]:<6.1f}" for lv in range(L)))
    return results


def synthetic(n_states=8, pumas=(3, 10), households=(2_000, 20_000), seed=7, max_outlier=500):
    """A small nation/state/PUMA hierarchy with ACS-like sizes plus a heavy tail."""
    rng = np.random.default_rng(seed)
    shares = np.array([0.267, 0.336, 0.158, 0.134, 0.062, 0.025, 0.018])
    parent_map, by_level = {"US": None}, {0: {}, 1: {}, 2: {}}
    S = max_outlier + 1
    states = {}
    for s in range(n_states):
        sk = f"{s:02d}"
        parent_map[sk] = "US"
        tot = np.zeros(S, np.int64)
        for p in range(rng.integers(*pumas)):
            n = rng.integers(*households)
            Hh = np.zeros(S, np.int64)
            Hh[1:8] = rng.multinomial(n, shares / shares.sum())
            i = 8
            while Hh[i - 1] > 0 and i < S:
                Hh[i] = rng.binomial(Hh[i - 1], 0.4)
                i += 1
            np.add.at(Hh, rng.integers(1, max_outlier + 1, 2), 1)
            by_level[2][(sk, p)] = Hh
            parent_map[(sk, p)] = sk
            tot += Hh
        by_level[1][sk] = tot
        states[sk] = tot
    by_level[0]["US"] = sum(states.values())
    return by_level, parent_map


def acs(max_size: int = 20):
    """The 12-state ACS 2018 hierarchy (nation -> 12 states -> 117 PUMAs): exact household-size
    histograms of the housing units (group quarters excluded), sizes up to ``max_size`` (the
    largest ACS household here has 20 persons, so nothing is clipped at 20)."""
    from engine.count_of_counts import geography_hierarchy, size_histograms
    from engine.data import HierarchicalData
    from schemas.domain_spec import load_domain_spec
    from schemas.ingestion import HouseholdRules, load_person_file

    root = os.environ.get("DPRELEASE_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data"))
    spec = load_domain_spec()
    zips = sorted(p for p in os.listdir(os.path.join(root, "acs2018_1yr")) if p.startswith("csv_p"))
    data = HierarchicalData.concat([load_person_file(os.path.join(root, "acs2018_1yr", z), spec, HouseholdRules(max_household_size=max_size))[0] for z in zips])
    h = geography_hierarchy(data.geo)
    H = size_histograms(h, data.geo, data.sizes, max_size)
    by_level = {lv: {h.keys[i]: H[i] for i in h.level_range(lv)} for lv in range(h.n_levels)}
    parent_map = {k: (None if p < 0 else h.keys[p]) for k, p in zip(h.keys, h.parent)}
    return by_level, parent_map


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--synthetic", action="store_true", help="run on a built-in synthetic hierarchy instead of the 12-state ACS data")
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 0.5, 1.0, 2.0])
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args(argv)
    by_level, pm = synthetic() if a.synthetic else acs()
    print(f"levels: {', '.join(f'{lv}: {len(v)} nodes' for lv, v in by_level.items())}  (level 0 nation, 1 state, 2 PUMA)")
    t = time.perf_counter()
    evaluate(by_level, a.eps, a.runs, parent_map=pm)
    print(f"\n({time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
