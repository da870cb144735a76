"""MST: the maximum-spanning-tree mechanism (winner of the 2018 NIST DP synthetic data
competition), generalised to any discrete dataset.

McKenna, Miklau, Sheldon, "Winning the NIST Contest: A scalable and general approach to
differentially private synthetic data", Journal of Privacy and Confidentiality 11(3), 2021
(arXiv:2108.04978), Algorithm 1.

Adapted from the reference implementation ``mechanisms/mst.py`` of private-pgm
(github.com/ryan112358/private-pgm @ 4d2b3c5, Apache-2.0) onto ``mbi`` 2.0.0:
``estimation.MirrorDescent().estimate`` replaces ``estimation.mirror_descent``; the domain
compression uses ``LinearMeasurement.compress`` / ``Dataset.compress`` / ``Dataset.decompress``
(the same re-expression as the reference's ``compress_domain`` / ``transform_data`` /
``reverse_data``: values whose noisy one-way count is below 3σ merge into one, the merged
measurement re-weighted by 1/√k, decompression samples uniformly among the merged values).
As in ``aim.py``, ``sensitivity`` (Δ) scales the Gaussian noise and the exponential mechanism's
quality sensitivity so that the same ρ covers neighbours that change every marginal by up to Δ.
Budget split as in the reference: ρ/3 one-way marginals, ρ/3 tree selection, ρ/3 two-way
marginals of the tree.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable

import networkx as nx
import numpy as np
from scipy.cluster.hierarchy import DisjointSet

from .common import exponential_mechanism, import_mbi

mbi = import_mbi()


def measure(data, cliques, sigma, rng, weights=None):
    if weights is None:
        weights = np.ones(len(cliques))
    weights = np.array(weights) / np.linalg.norm(weights)
    out = []
    for proj, wgt in zip(cliques, weights):
        x = np.asarray(data.project(proj).datavector(), dtype=np.float64)
        y = x + rng.normal(0.0, sigma / wgt, x.size)
        out.append(mbi.LinearMeasurement(y, tuple(proj), stddev=sigma / wgt))
    return out


def compress_domain(data, measurements):
    """Merge the values of each attribute whose noisy count is below 3σ into one value."""
    mapping = {}
    for M in measurements:
        col = M.clique[0]
        sup = np.asarray(M.noisy_measurement) >= 3 * M.stddev
        if sup.all():
            continue
        m = np.empty(sup.size, dtype=np.int64)
        m[sup] = np.arange(sup.sum())
        m[~sup] = sup.sum()
        mapping[col] = m
    new = [M.compress(mapping, data.domain) for M in measurements]
    return data.compress(mapping), new, mapping


def select(data, rho, measurement_log, rng, sensitivity=1.0, iters=2500, cliques=()):
    """Maximum spanning tree by repeated exponential mechanism on the L1 error of every pair
    against the one-way model; ρ split evenly over the r−1 edges (ε = √(8ρ/(r−1)))."""
    est = mbi.estimation.MirrorDescent().estimate(data.domain, measurement_log, iters=iters)
    weights = {}
    candidates = list(itertools.combinations(data.domain.attributes, 2))
    for a, b in candidates:
        xhat = np.asarray(est.project([a, b]).datavector(), dtype=np.float64)
        x = np.asarray(data.project([a, b]).datavector(), dtype=np.float64)
        weights[a, b] = np.linalg.norm(x - xhat, 1)

    T = nx.Graph()
    T.add_nodes_from(data.domain.attributes)
    ds = DisjointSet(data.domain.attributes)
    for e in cliques:
        T.add_edge(*e)
        ds.merge(*e)
    r = len(list(nx.connected_components(T)))
    epsilon = math.sqrt(8 * rho / (r - 1))
    for _ in range(r - 1):
        candidates = [e for e in candidates if not ds.connected(*e)]
        e = exponential_mechanism({c: weights[c] for c in candidates}, epsilon, sensitivity, rng)
        T.add_edge(*e)
        ds.merge(*e)
    return list(T.edges)


def run(data, rho: float, *, rng: np.random.Generator, sensitivity: float = 1.0, iters: int = 10000,
        select_iters: int = 2500, log: Callable[[str], None] = lambda s: None):
    """MST on ``data`` (an ``mbi.Dataset``) at ρ-zCDP. Returns (synthetic Dataset, info)."""
    t0 = time.perf_counter()
    sigma = math.sqrt(3 / (2 * rho)) * sensitivity
    cliques = [(col,) for col in data.domain]
    log1 = measure(data, cliques, sigma, rng)
    cdata, log1, mapping = compress_domain(data, log1)
    tree = select(cdata, rho / 3.0, log1, rng, sensitivity=sensitivity, iters=select_iters)
    log(f"MST: tree {tree} selected (σ={sigma:.1f}), {time.perf_counter() - t0:.0f}s")
    log2 = measure(cdata, tree, sigma, rng)
    est = mbi.estimation.MirrorDescent().estimate(cdata.domain, log1 + log2, iters=iters)
    synth = est.synthetic_data().decompress(mapping)
    info = {"tree": ["|".join(e) for e in tree], "compressed": {k: int(v.max()) + 1 for k, v in mapping.items()},
            "estimated_total": float(est.total)}
    return synth, info
