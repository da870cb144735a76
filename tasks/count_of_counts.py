"""The count-of-counts stage: household-size histograms for nation, states and PUMAs, measured
through the ledger and made consistent top-down (Kuo et al., VLDB 2018).

Noise: the discrete Gaussian by default (under zCDP its cost depends on the L2 sensitivity √(K−1)
of Hc under the household unit, against L1 = K−1 for the paper's discrete Laplace: about 14× less
variance at K = 8 for the same ρ), or the paper's discrete Laplace (``mechanism: laplace``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from prefect import task

from engine.count_of_counts import estimators
from engine.count_of_counts.api import run_hierarchy
from engine.count_of_counts.geography import geography_hierarchy, hc_l1_sensitivity, hc_l2_sensitivity, size_histograms
from engine.hierarchical_data import HierarchicalData
from schemas.release_config import ReleaseConfig
from tasks.privacy import budget_plan, measurement_store, open_ledger
from tasks.run_context import RunPaths, save_npz_atomic

LEVEL_NAMES = ("nation", "state", "puma")
STAGE = "count_of_counts"


def equivalent_epsilon(mechanism: str, scale: float) -> float:
    """The ε the estimators expect: they model per-cell noise variance as 2/ε² (Laplace of scale
    1/ε). Laplace of scale b has variance 2b²; a (discrete) Gaussian of σ has variance ≈ σ²."""
    return 1.0 / scale if mechanism == "discrete_laplace" else float(np.sqrt(2.0) / scale)


def _measure_group_counts(cfg: ReleaseConfig, paths: RunPaths, h, G_leaf: np.ndarray, leaves: np.ndarray) -> np.ndarray:
    """Private household counts: discrete Laplace on every PUMA's count (Δ₁ = 1 under the
    household unit), charged to the group_counts stage. Returns (N,) with NaN off the leaves."""
    ledger, store = open_ledger(cfg, paths), measurement_store(paths)
    rho = budget_plan(cfg).allocation("group_counts", "puma")
    noisy = np.full(h.n_nodes, np.nan)
    for i, g in zip(leaves, G_leaf):
        key = h.keys[i]
        m = store.measure_laplace(key=f"group_counts/puma/{key}/G", ledger=ledger, stage="group_counts", level="puma", node=key, workload_id="G", true_answer=np.array([g]), l1_sensitivity=1, rho=rho)
        noisy[i] = float(m.noisy_answer[0])
    return noisy


@task(name="count-of-counts")
def count_of_counts_task(cfg: ReleaseConfig, paths: RunPaths, private_npz: str) -> str:
    """Measure Hc of every node (one discrete Laplace measurement per node, ε per level from the
    plan's ρ), estimate (isotonic L1), make consistent top-down; persist and return the result path."""
    out = paths.node_path(STAGE, "hierarchy")
    if out.exists():
        return str(out)
    data = HierarchicalData.from_npz(private_npz)
    K = data.domain.max_size
    h = geography_hierarchy(data.geo)
    H = size_histograms(h, data.geo, data.sizes, K)
    plan = budget_plan(cfg)
    ledger, store = open_ledger(cfg, paths), measurement_store(paths)
    mech = cfg.count_of_counts.mechanism
    noisy, eps = {}, []
    for lv, name in enumerate(LEVEL_NAMES):
        ids = h.level_range(lv)
        hc = estimators.hc_query(H[ids], K).values
        rows = []
        for i, row in zip(ids, hc):
            common = dict(key=f"{STAGE}/{name}/{h.keys[i]}/Hc", ledger=ledger, stage=STAGE, level=name, node=h.keys[i], workload_id="Hc", true_answer=row.astype(np.int64), rho=plan.allocation(STAGE, name))
            if mech == "laplace":  # the paper's double-geometric noise, ε-DP charged as ρ = ε²/2
                m = store.measure_laplace(l1_sensitivity=hc_l1_sensitivity(K, cfg.privacy_unit), **common)
            else:
                m = store.measure(l2_sensitivity=hc_l2_sensitivity(K, cfg.privacy_unit), **common)
            rows.append(m.noisy_answer)
        noisy[lv] = np.stack(rows)
        eps.append(equivalent_epsilon(m.mechanism, m.scale))
    leaves = h.leaves()
    kwargs = {}
    if cfg.count_of_counts.group_counts == "private":
        kwargs["noisy_group_counts"] = _measure_group_counts(cfg, paths, h, H[leaves].sum(axis=1), leaves)
    else:
        kwargs["group_counts"] = H[leaves].sum(axis=1)  # public, as the Census Bureau treats housing-unit counts
    res = run_hierarchy(h, noisy, eps, K=K, method="hc", consistency=cfg.count_of_counts.consistency, **kwargs)
    save_npz_atomic(out, lambda f: np.savez(f, keys=np.array(h.keys), level=h.level, histograms=res.histograms, K=K))
    return str(out)


def load_result(path: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return [str(k) for k in z["keys"]], z["level"], z["histograms"]


def puma_sizes(path: str) -> dict[tuple[int, int], np.ndarray]:
    """{(ST, PUMA): counts of households of size 1..K} from a count-of-counts result."""
    keys, level, H = load_result(path)
    out = {}
    for k, lv, row in zip(keys, level, H):
        if lv == 2:
            st, puma = k.split("/")
            out[(int(st[3:]), int(puma[5:]))] = row[1:].astype(np.int64)
    return out


def as_table(path: str) -> pa.Table:
    """The release's count_of_counts.parquet: (level, node, size, households), sizes 1..K."""
    keys, level, H = load_result(path)
    K = H.shape[1] - 1
    n = len(keys)
    return pa.table(
        {
            "level": pa.array(np.repeat(np.array(LEVEL_NAMES)[level], K).tolist(), pa.string()),
            "node": pa.array(np.repeat(np.array(keys), K).tolist(), pa.string()),
            "size": pa.array(np.tile(np.arange(1, K + 1), n).astype(np.int16)),
            "households": pa.array(H[:, 1:].reshape(-1).astype(np.int64)),
        }
    )
