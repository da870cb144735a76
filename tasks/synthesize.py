"""Synthesis tasks, one geography node each; every result is persisted so a resumed run reuses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prefect import task

from engine.hierarchical_data import HierarchicalData
from tasks.run_context import save_npz_atomic


def node_rng(seed: int, node: tuple[int, ...]) -> np.random.Generator:
    """Post-processing randomness of one node, reproducible from the run's sampling seed."""
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=tuple(int(x) for x in node)))


def place(data: HierarchicalData, node: tuple[int, ...]) -> HierarchicalData:
    return data.with_geo(np.tile(np.asarray(node, dtype=np.int32), (data.n_households, 1)))


def public_only_baseline(public: HierarchicalData, private: HierarchicalData, seed: int) -> HierarchicalData:
    """The ε = 0 baseline for every PUMA of ``private`` at once (for QA and benchmarks)."""
    nodes, counts = np.unique(private.geo, axis=0, return_counts=True)
    parts = [place(public.take(node_rng(seed + 1, tuple(n)).integers(0, public.n_households, g)), tuple(n)) for n, g in zip(nodes, counts)]
    return HierarchicalData.concat(parts)


@task(name="synthesize-puma-public-baseline")
def public_baseline_puma(public_npz: str, node: tuple[int, int], n_households: int, seed: int, out_path: str) -> str:
    """The papers' ε = 0 baseline: resample public households (uniformly, with replacement) up to
    the PUMA's household count."""
    out = Path(out_path)
    if out.exists():
        return out_path
    public = HierarchicalData.from_npz(public_npz)
    rng = node_rng(seed, node)
    synth = place(public.take(rng.integers(0, public.n_households, n_households)), node)
    save_npz_atomic(out, synth.to_npz)
    return out_path
