"""Synthesis tasks, one geography node each; every result is persisted so a resumed run reuses it.

- ``select_workload_task``: workloads from mutual information on the PUBLIC data (no privacy cost).
- ``state_update_task``: per state, measure the state workload (discrete Gaussian through the
  ledger) and update the public prior into the state posterior.
- ``puma_task``: per PUMA, measure the PUMA workload and update the state posterior into the PUMA
  posterior (prior update), or keep the public prior (public-only baseline); then sample the PUMA's
  households — exactly the count-of-counts numbers of each size when that stage ran.
"""

from __future__ import annotations

import json
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

import numpy as np
from prefect import task

from engine.hierarchical_data import HierarchicalData
from engine.prior_update import sample_households
from engine.queries import Workload
from engine.support import Support
from engine.synthesis import synthesize_node
from engine.workload_selection import select_workloads
from schemas.release_config import ReleaseConfig
from tasks.privacy import budget_plan, measurement_store, open_ledger
from tasks.run_context import RunPaths, save_npz_atomic, write_json_atomic


def node_rng(seed: int, node: tuple[int, ...]) -> np.random.Generator:
    """Post-processing randomness of one node, reproducible from the run's sampling seed."""
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(x) for x in node)))


def place(data: HierarchicalData, node: tuple[int, ...]) -> HierarchicalData:
    return data.with_geo(np.tile(np.asarray(node, dtype=np.int32), (data.n_households, 1)))


@lru_cache(maxsize=16)
def cached_support(public_npz: str) -> Support:
    """The public support, built once per worker process (incidences are cached on it)."""
    return Support.from_data(HierarchicalData.from_npz(public_npz))


@lru_cache(maxsize=2)
def cached_data(npz: str) -> HierarchicalData:
    return HierarchicalData.from_npz(npz)


def node_key(node: tuple[int, ...]) -> str:
    return f"ST={node[0]:02d}" if len(node) == 1 else f"ST={node[0]:02d}/PUMA={node[1]:05d}"


def ledger_measure(cfg: ReleaseConfig, paths: RunPaths, stage: str, level: str, node: str):
    """The measure callable of engine.synthesis, routed through the ledger and the store: every
    noisy answer is charged and persisted before it is used, and read back on a rerun."""
    ledger, store = open_ledger(cfg, paths), measurement_store(paths)

    def measure(w: Workload, counts: np.ndarray, l2: float, rho: Fraction):
        m = store.measure(key=f"{stage}/{node}/{w.id}", ledger=ledger, stage=stage, level=level, node=node, workload_id=w.id, true_answer=counts, l2_sensitivity=l2, rho=rho)
        return m.noisy_answer, m.scale

    return measure


@task(name="select-workload")
def select_workload_task(public_npz: str, out_path: str) -> dict:
    """Mutual information on the public data only: no privacy cost."""
    out = Path(out_path)
    if out.exists():
        return json.loads(out.read_text())
    sel = select_workloads(HierarchicalData.from_npz(public_npz))
    record = {"state": [w.id for w in sel.state], "puma": [w.id for w in sel.puma], "explanation": sel.explanation}
    write_json_atomic(out, record)
    return record


@task(name="synthesize-state")
def state_update_task(cfg: ReleaseConfig, paths: RunPaths, public_npz: str, private_npz: str, state: int, workload_ids: list[str]) -> str:
    node = node_key((state,))
    out = paths.node_path("state_posterior", node)
    if out.exists():
        return str(out)
    support = cached_support(public_npz)
    private = cached_data(private_npz)
    mine = private.select(private.node_mask((state,)))
    s = cfg.synthesis
    res = synthesize_node(
        support, support.weights, mine, [Workload.from_id(w) for w in workload_ids],
        budget_plan(cfg).allocation("state_synthesis", "state"), cfg.privacy_unit,
        ledger_measure(cfg, paths, "state_synthesis", "state", node), total=mine.n_households,
        rule=s.update_rule, prior_strength=s.prior_strength, sweeps=s.sweeps,
    )
    save_npz_atomic(out, lambda f: np.savez(f, weights=res.weights))
    write_json_atomic(out.with_suffix(".json"), {"node": node, "diagnostics": res.diagnostics})
    return str(out)


@task(name="synthesize-puma")
def puma_task(
    cfg: ReleaseConfig,
    paths: RunPaths,
    public_npz: str,
    private_npz: str,
    node: tuple[int, int],
    n_households: int,
    sizes: list[int] | None,
    state_posterior: str | None,
    workload_ids: list[str],
    seed: int,
) -> str:
    """One PUMA: posterior (or the public prior for the baseline), then sampled households."""
    key = node_key(node)
    out = paths.node_path("synthesis", key)
    if out.exists():
        return str(out)
    support = cached_support(public_npz)
    if state_posterior is None:  # public-only baseline (ε = 0): the public empirical distribution
        weights = support.weights
    else:
        with np.load(state_posterior) as z:
            prior = z["weights"]
        private = cached_data(private_npz)
        mine = private.select(private.node_mask(node))
        s = cfg.synthesis
        res = synthesize_node(
            support, prior, mine, [Workload.from_id(w) for w in workload_ids],
            budget_plan(cfg).allocation("puma_synthesis", "puma"), cfg.privacy_unit,
            ledger_measure(cfg, paths, "puma_synthesis", "puma", key), total=n_households,
            rule=s.update_rule, prior_strength=s.prior_strength, sweeps=s.sweeps,
        )
        weights = res.weights
        write_json_atomic(out.with_suffix(".json"), {"node": key, "diagnostics": res.diagnostics})
    rng = node_rng(seed, node)
    synth = sample_households(support, weights, None if sizes is not None else n_households, rng, sizes=sizes, geo=node)
    save_npz_atomic(out, synth.to_npz)
    return str(out)


def public_only_baseline(public: HierarchicalData, private: HierarchicalData, seed: int) -> HierarchicalData:
    """The ε = 0 baseline for every PUMA of ``private`` at once (for QA and benchmarks)."""
    nodes, counts = np.unique(private.geo, axis=0, return_counts=True)
    parts = [place(public.take(node_rng(seed + 1, tuple(n)).integers(0, public.n_households, g)), tuple(n)) for n, g in zip(nodes, counts)]
    return HierarchicalData.concat(parts)
