"""k-way hierarchical workloads for H-GEM evaluation (H-GEM paper, appendix A.1.2).

"We restrict the number of attributes for each query to |S| = 3. Because of the size of
ACS-SMALL, we simply choose all possible queries in this setting. For ACS, we randomly sample k
sets of attributes for each possible number of group-level attributes (|S_G| = 0 … 3)." Every
attribute set S gives one group-level and one person-level workload (Table 1).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from engine.data import Domain
from engine.hgem.settings import HGEMSettings
from engine.queries import Level, Workload


def kway_attribute_sets(
    domain: Domain, k: int = 3, per_group_count: int | None = None, seed: int = 0
) -> list[tuple[tuple[str, ...], tuple[str, ...]]]:
    """All (S_G, S_I) with |S_G| + |S_I| = k, or ``per_group_count`` random ones per |S_G|."""
    gnames = [a.name for a in domain.group]
    pnames = [a.name for a in domain.person]
    rng = np.random.default_rng(seed)
    out: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
    for ng in range(0, k + 1):
        npers = k - ng
        if ng > len(gnames) or npers > len(pnames):
            continue
        combos = [(g, p) for g in itertools.combinations(gnames, ng) for p in itertools.combinations(pnames, npers)]
        if per_group_count is not None and len(combos) > per_group_count:
            pick = rng.choice(len(combos), size=per_group_count, replace=False)
            combos = [combos[i] for i in sorted(pick)]
        out.extend(combos)
    return out


def kway_workloads(
    domain: Domain,
    k: int = 3,
    per_group_count: int | None = None,
    seed: int = 0,
    levels: Sequence[Level] = ("group", "person"),
) -> list[Workload]:
    """Group- and person-level workloads for every k-way attribute set (see module docstring)."""
    return [Workload(lv, g, p) for g, p in kway_attribute_sets(domain, k, per_group_count, seed) for lv in levels]


def candidate_workloads(domain: Domain, settings: HGEMSettings) -> list[Workload]:
    """The pipeline's candidate set Q for the adaptive rounds: ``settings.kway``-way workloads,
    ``settings.kway_per_group_count`` attribute sets per number of group attributes, drawn with
    ``settings.workload_seed`` (public and deterministic: the same on every rerun)."""
    return kway_workloads(domain, settings.kway, settings.kway_per_group_count, seed=settings.workload_seed)
