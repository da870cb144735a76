"""Scale benchmark for hierarchical count-of-counts (Kuo et al., VLDB 2018, Section 6.1).

Builds a partially synthetic census-scale hierarchy like the paper's "synthetic housing"
data set -- nation / 51 states / ~3,200 counties, ~240 M households, sizes 1..7 with
SF1-like shares, a binomial geometric tail beyond 7 and 50 outliers per state with sizes
uniform in 1..10,000 -- generated directly as per-node histograms (never one entry per
household), and runs the three-level top-down with the Hc method (L1 isotonic, weighted
merge) end to end: measurement (noise), per-node estimation, consistency, histograms.

Reports wall time and peak memory (getrusage max RSS; tracemalloc with --tracemalloc),
and, at 10 M households in the same process, the speed ratio against a per-group reference
top-down (one entry per household, sort-based matching, per-group merge).

Noise here comes from ``double_geometric`` below: BENCHMARK-ONLY, NOT FOR RELEASES (the
release path measures through engine.privacy / OpenDP).

    python benchmarks/count_of_counts_scale.py            # 240 M + 10 M comparison
    python benchmarks/count_of_counts_scale.py --quick    # small smoke run
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from engine.count_of_counts import Hierarchy, RunsTable, consistent_histograms, emd_batch, estimate_hc, k_from_noisy_max, top_down  # noqa: E402

SF1_SHARES = np.array([0.267, 0.336, 0.158, 0.134, 0.062, 0.025, 0.018])  # sizes 1..7


def double_geometric(x, scale, rng, out_dtype=np.int64):
    """x + discrete Laplace(scale) noise.  BENCHMARK-ONLY sampler, not for releases."""
    p = 1.0 - np.exp(-1.0 / scale)
    noise = rng.geometric(p, np.shape(x)).astype(out_dtype)
    noise -= rng.geometric(p, np.shape(x))
    return np.asarray(x, dtype=out_dtype) + noise


def build_hierarchy(n_households: float, n_states: int, n_counties: int, rng, max_outlier: int = 10_000):
    """Per-county histograms (n_counties, S) as counts plus the Hierarchy.  States get a
    heavy-tailed share of households; counties a lognormal share of their state."""
    w = rng.lognormal(0, 1.0, n_states)
    st_hh = np.maximum(rng.multinomial(int(n_households), w / w.sum()), 100)
    ncty = np.maximum(1, np.round(n_counties * st_hh / st_hh.sum()).astype(int))
    S = max_outlier + 1
    leaf_rows = []
    parents = []
    for s in range(n_states):
        H = np.zeros(S, np.int64)
        H[1:8] = rng.multinomial(st_hh[s], SF1_SHARES / SF1_SHARES.sum())
        ratio = min(0.9, H[7] / max(H[6], 1))
        i = 8
        while i < S and H[i - 1] > 0:  # binomial tail keeping the 7/6 ratio in expectation
            H[i] = rng.binomial(H[i - 1], ratio)
            i += 1
        np.add.at(H, rng.integers(1, max_outlier + 1, 50), 1)
        cw = rng.lognormal(0, 1.2, ncty[s])
        nz = np.flatnonzero(H)
        split = rng.multinomial(H[nz], cw / cw.sum())  # (U, n_counties)
        L = np.zeros((ncty[s], S), np.int64)
        L[:, nz] = split.T
        leaf_rows.append(L)
        parents.append(np.full(ncty[s], s))
    leaves = np.concatenate(leaf_rows)
    h = Hierarchy.from_levels([[0], np.zeros(n_states, int), np.concatenate(parents)])
    return h, leaves


def level_histograms(h: Hierarchy, leaves: np.ndarray) -> dict[int, np.ndarray]:
    lv2 = h.level_range(2)
    par = h.parent[lv2] - h.level_range(1)[0]
    starts = np.flatnonzero(np.concatenate(([True], par[1:] != par[:-1])))
    states = np.add.reduceat(leaves, starts, axis=0)
    return {0: states.sum(0, keepdims=True), 1: states, 2: leaves}


def measure_and_estimate(h, hist_by_level, eps_total, rng, K=None):
    """Private max size -> K, then per level: Hc query, noise, Hc estimation (L1)."""
    n_lv = h.n_levels
    eps_k = 0.01 * eps_total
    eps_lv = (eps_total - eps_k) / n_lv
    t = {}
    t0 = time.perf_counter()
    if K is None:
        nat = hist_by_level[0][0]
        K = k_from_noisy_max(double_geometric(np.flatnonzero(nat)[-1:], 1 / eps_k, rng), np.sqrt(2.0) / eps_k)
    G = np.zeros(h.n_nodes, np.int64)
    parts = []
    t["estimate"] = 0.0
    t["measure"] = 0.0
    for lv in range(n_lv):
        ids = h.level_range(lv)
        Hk = hist_by_level[lv]
        ta = time.perf_counter()
        if Hk.shape[1] > K + 1:
            Hk = np.concatenate([Hk[:, :K], Hk[:, K:].sum(1, keepdims=True)], axis=1)
        elif Hk.shape[1] < K + 1:
            Hk = np.pad(Hk, ((0, 0), (0, K + 1 - Hk.shape[1])))
        G[ids] = Hk.sum(1)
        noisy = double_geometric(np.cumsum(Hk, axis=1)[:, :K], 1 / eps_lv, rng)  # Hc, sensitivity 1
        tb = time.perf_counter()
        parts.append(estimate_hc(noisy, G[ids], 2.0 / eps_lv**2, norm="l1", node_ids=ids))  # Laplace(1/ε): variance 2/ε²
        del noisy
        tc = time.perf_counter()
        t["measure"] += tb - ta
        t["estimate"] += tc - tb
    t["k_and_measure_total"] = time.perf_counter() - t0
    return K, G, RunsTable.concat(parts), t


# ---------------------------------------------------------------------------------
# per-group reference (one entry per household, sort-based matching)


def reference_top_down(h: Hierarchy, est: RunsTable, K: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per-group top-down: expand every node's runs to one (size, var) per group, match the
    sorted parent groups with the sorted union of the children's groups position by
    position (ties between children in child order), inverse-variance merge per group."""
    groups = {}
    for v in range(h.n_nodes):
        r = est.for_node(v)
        groups[v] = (np.repeat(r.size, r.count), np.repeat(r.var, r.count))
    cur = {v: groups[v] for v in h.level_range(0)}
    for lv in range(h.n_levels - 1):
        nxt = {}
        kids_of = {}
        for c in h.level_range(lv + 1):
            kids_of.setdefault(int(h.parent[c]), []).append(int(c))
        for p, kids in kids_of.items():
            ps, pv = cur[p]
            o = np.argsort(ps, kind="stable")
            ps, pv = ps[o], pv[o]
            cs = np.concatenate([groups[c][0] for c in kids])
            cv = np.concatenate([groups[c][1] for c in kids])
            cid = np.repeat(np.arange(len(kids)), [groups[c][0].size for c in kids])
            oc = np.argsort(cs, kind="stable")
            cs, cv, cid = cs[oc], cv[oc], cid[oc]
            v = 1.0 / (1.0 / pv + 1.0 / cv)
            s = np.clip(np.rint((ps / pv + cs / cv) * v), 0, K).astype(np.int64)
            for k, c in enumerate(kids):
                m = cid == k
                nxt[c] = (s[m], v[m])
        cur = nxt
    return cur


def reference_histograms(h, leaf_groups, K):
    out = np.zeros((h.n_nodes, K + 1), np.int64)
    for v, (s, _) in leaf_groups.items():
        out[v] = np.bincount(s, minlength=K + 1)
    return h.aggregate_up(out)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_scale(n_households, n_states, n_counties, eps, seed, use_tracemalloc=False):
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    h, leaves = build_hierarchy(n_households, n_states, n_counties, rng)
    hist = level_histograms(h, leaves)
    t_gen = time.perf_counter() - t0
    if use_tracemalloc:
        tracemalloc.start()
    t1 = time.perf_counter()
    K, G, est, tm = measure_and_estimate(h, hist, eps, rng)
    t2 = time.perf_counter()
    final = top_down(h, est, K)
    t3 = time.perf_counter()
    out = consistent_histograms(h, final, K)
    t4 = time.perf_counter()
    traced = tracemalloc.get_traced_memory()[1] / 2**20 if use_tracemalloc else float("nan")
    if use_tracemalloc:
        tracemalloc.stop()
    errs = {}
    for lv in range(h.n_levels):
        ids = h.level_range(lv)
        Hk = hist[lv]
        Hk = np.concatenate([Hk[:, :K], Hk[:, K:].sum(1, keepdims=True)], axis=1) if Hk.shape[1] > K + 1 else np.pad(Hk, ((0, 0), (0, K + 1 - Hk.shape[1])))
        errs[lv] = float(emd_batch(Hk, out[ids]).mean())
    return dict(
        households=int(G[0]), nodes=h.n_nodes, counties=int(h.level_range(2).size), K=K, runs=len(est),
        t_generate=t_gen, t_measure=tm["measure"], t_estimate=tm["estimate"], t_consistency=t3 - t2,
        t_histograms=t4 - t3, t_end_to_end=t4 - t1, peak_rss_mb=peak_rss_mb(), traced_peak_mb=traced,
        emd=errs, h=h, est=est, final=final, out=out,
    )


def compare_reference(res, K):
    """Time the consistency step (runs vs per-group) and the histogram materialisation."""
    h, est = res["h"], res["est"]
    t0 = time.perf_counter()
    final = top_down(h, est, K)
    t1 = time.perf_counter()
    out = consistent_histograms(h, final, K)
    t2 = time.perf_counter()
    leaf_groups = reference_top_down(h, est, K)
    t3 = time.perf_counter()
    out_ref = reference_histograms(h, leaf_groups, K)
    t4 = time.perf_counter()
    return dict(td_runs=t1 - t0, hist_runs=t2 - t1, td_ref=t3 - t2, hist_ref=t4 - t3), out, out_ref


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small smoke size")
    ap.add_argument("--households", type=float, default=240e6)
    ap.add_argument("--ref-households", type=float, default=10e6)
    ap.add_argument("--eps", type=float, default=1.0, help="total epsilon (1%% for K, rest split over 3 levels)")
    ap.add_argument("--tracemalloc", action="store_true", help="also report tracemalloc peak (slower)")
    ap.add_argument("--seed", type=int, default=2018)
    a = ap.parse_args(argv)
    n_big, n_ref, n_cty = (2e6, 2e5, 300) if a.quick else (a.households, a.ref_households, 3200)

    big = run_scale(n_big, 51, n_cty, a.eps, a.seed, a.tracemalloc)
    print(f"== census-scale run: {big['households']:,} households, {big['nodes']} nodes "
          f"({big['counties']} counties), K={big['K']}, {big['runs']:,} runs")
    for k in ("t_generate", "t_measure", "t_estimate", "t_consistency", "t_histograms", "t_end_to_end"):
        print(f"  {k:16s} {big[k]:8.2f} s")
    print(f"  peak RSS         {big['peak_rss_mb']:8.0f} MB" + (f"   (tracemalloc peak {big['traced_peak_mb']:.0f} MB)" if a.tracemalloc else ""))
    print("  mean EMD/node    " + "  ".join(f"L{lv}: {e:,.1f}" for lv, e in big["emd"].items()), flush=True)
    for k in ("h", "est", "final", "out"):
        big.pop(k)

    ref = run_scale(n_ref, 51, n_cty, a.eps, a.seed + 1)
    K = ref["K"]
    tt, out, out_ref = compare_reference(ref, K)
    h = ref["h"]
    emd_lv = [float(emd_batch(out_ref[h.level_range(lv)], out[h.level_range(lv)]).mean()) for lv in range(3)]
    est_time = ref["t_measure"] + ref["t_estimate"]
    rows = [
        ("top-down consistency", tt["td_runs"], tt["td_ref"]),
        ("dense histograms of all nodes", tt["hist_runs"], tt["hist_ref"]),
        ("consistency + histograms", tt["td_runs"] + tt["hist_runs"], tt["td_ref"] + tt["hist_ref"]),
        ("end to end (incl. measure+estimate)", est_time + tt["td_runs"] + tt["hist_runs"],
         est_time + tt["td_ref"] + tt["hist_ref"]),
    ]
    print(f"\n== per-group reference at {ref['households']:,} households (same noisy estimates, "
          f"measure+estimate {est_time:.2f} s shared)")
    print(f"  {'step':38s} {'runs (s)':>10s} {'per-group (s)':>14s} {'ratio':>9s}")
    for name, a_, b_ in rows:
        print(f"  {name:38s} {a_:10.3f} {b_:14.3f} {b_ / a_:8.1f}x")
    print("  mean EMD between the two outputs per level (tie-splitting differences): "
          + ", ".join(f"{e:.1f}" for e in emd_lv))
    t_runs, t_ref = tt["td_runs"], tt["td_ref"]
    return big, (t_runs, t_ref)


if __name__ == "__main__":
    main()
