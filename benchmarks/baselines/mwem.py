"""MWEM over an explicit histogram of households on a reduced domain (H-GEM paper §4.1, A.2.1): a
baseline of the H-GEM benchmark (`benchmarks/hgem_accuracy.py`), never used by a release.

The universe is X = G × (I × ⊥)^M: a household is its group attributes plus an *ordered* tuple of
m ∈ 1..M persons (slot 1 = householder), exactly the paper's count d = d_G Σ_{m=1..M} d_I^m
(ACS-SMALL: d_G = 60, d_I = 2⁴, M = 3 → 262 080). Ordered tuples are used (not multisets) because
slot order carries the householder, matching HierarchicalData and the H-GEM generator.

The histogram A is stored as one probability tensor per size m, of shape
(group sizes…, person sizes… × m). Workload answers are exact and vectorised: for each m, sum A_m
onto the workload's group axes and every slot's person axes (one einsum), then map the m-tuple of
person cells to the workload's cells with a small matrix C_m[t, y] = 1{some slot of t equals y}
(group level, "contains") or #{slots of t equal to y} (person level).

MWEM (Algorithm 1 & 2 of the H-GEM appendix, with the Liu et al. 2021a improvements: Gaussian
measurements, zCDP, re-using past measurements, the marginal trick of the GEM appendix A.1):
select a workload, measure it, then for the top-T_max past measurements whose error is ≥ half the
largest, in random order, A(x) ∝ A(x) exp(Σ_y q̂_y(x) (m_y − q_y(A)) / 2) with q̂ = q (group) or
q/M (person level). Σ_y q̂_y(x) e_y is the gradient of the linear map A ↦ Σ_y e_y ⟨φ_y, A⟩, taken
with autograd. Output: the average of the iterates (paper: avg_t A_{t−1}).

:func:`reduce_data` builds the ACS-SMALL-like reduced data from a full HierarchicalData.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from engine.data import Attribute, Domain, HierarchicalData
from engine.hgem.mixture import resolve_device
from engine.queries import Workload

# ----------------------------------------------------------------------------------------------
# reduced domain
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReducedDomainSpec:
    """How a full domain was reduced: code maps per kept attribute (full code index → reduced)."""

    group_attrs: tuple[str, ...]
    group_maps: tuple[tuple[int, ...], ...]
    person_attrs: tuple[str, ...]
    person_maps: tuple[tuple[int, ...], ...]
    max_size: int
    size_rule: str
    domain: Domain


def _merged_attr(a: Attribute, mapping: Sequence[int], suffix: str) -> Attribute:
    k = max(mapping) + 1
    if k == a.size and list(mapping) == list(range(a.size)):
        return a
    labels = tuple("|".join(a.labels[c] for c in range(a.size) if mapping[c] == r) for r in range(k))
    return Attribute(a.name + suffix, tuple(str(r) for r in range(k)), labels)


def reduce_data(
    data: HierarchicalData,
    n_group: int = 4,
    n_person: int = 4,
    max_size: int = 3,
    group_attrs: Sequence[str] | None = None,
    person_attrs: Sequence[str] | None = None,
    person_ones: Mapping[str, Sequence[int]] | None = None,
    max_group_categories: int = 5,
    size_rule: Literal["clip", "drop"] = "clip",
) -> tuple[HierarchicalData, ReducedDomainSpec]:
    """An ACS-SMALL-like reduction (H-GEM appendix A.1.1: 4 group attrs, 4 binarised person attrs, M = 3).

    Choice (data-independent, so no privacy cost):
    * group attributes: ``group_attrs`` or the ``n_group`` non-size group attributes with the
      fewest categories (ties: domain order); codes ≥ ``max_group_categories`` − 1 are merged into
      the last category (renamed ``<name>_CAP``) so that d_G stays small. NP is kept with codes
      1..``max_size``.
    * person attributes: ``person_attrs`` or the ``n_person`` person attributes with the fewest
      categories; each is binarised (renamed ``<name>_BIN`` unless already binary): code indices
      in ``person_ones[name]`` → 1, others → 0; by default the upper half of the code indices
      (index ≥ size // 2, e.g. the older age bands) → 1.
    * households with more than ``max_size`` persons: ``"clip"`` keeps the first ``max_size``
      persons (householder first) and sets NP = ``max_size``; ``"drop"`` removes them (the paper:
      "we select households of size M = 3 or smaller").
    """
    dom = data.domain
    gcands = [a for a in dom.group if a.name != dom.size_attribute]
    if group_attrs is None:
        gsel = sorted(gcands, key=lambda a: (a.size, gcands.index(a)))[: min(n_group, len(gcands))]
        gsel = [a for a in gcands if a in gsel]
    else:
        gsel = [dom.group_attribute(n) for n in group_attrs]
    if person_attrs is None:
        pc = list(dom.person)
        psel = sorted(pc, key=lambda a: (a.size, pc.index(a)))[: min(n_person, len(pc))]
        psel = [a for a in pc if a in psel]
    else:
        psel = [dom.person_attribute(n) for n in person_attrs]
    person_ones = dict(person_ones or {})
    gmaps = [tuple(min(c, max_group_categories - 1) for c in range(a.size)) for a in gsel]
    pmaps = []
    for a in psel:
        ones = set(person_ones.get(a.name, range(a.size // 2, a.size)))
        pmaps.append(tuple(1 if c in ones else 0 for c in range(a.size)))
    np_attr = Attribute(dom.size_attribute, tuple(str(i) for i in range(1, max_size + 1)), tuple(str(i) for i in range(1, max_size + 1)))
    new_group = [_merged_attr(a, m, "_CAP") for a, m in zip(gsel, gmaps)]
    new_person = [_merged_attr(a, m, "_BIN") for a, m in zip(psel, pmaps)]
    # keep NP where it sits relative to the kept group attributes
    np_pos = sum(1 for a in gsel if dom.group_index(a.name) < dom.group_index(dom.size_attribute))
    new_group.insert(np_pos, np_attr)
    rdom = Domain(tuple(new_group), tuple(new_person), dom.geography, max_size, dom.size_attribute)

    sizes = data.sizes
    if size_rule == "drop":
        data = data.select(sizes <= max_size)
        sizes = data.sizes
    elif size_rule != "clip":
        raise ValueError("size_rule must be 'clip' or 'drop'")
    keep = data.person_slot < max_size
    new_sizes = np.minimum(sizes, max_size)
    gcols = []
    k = 0
    for a in rdom.group:  # new_group = gsel in order, with NP inserted at np_pos
        if a.name == dom.size_attribute:
            gcols.append(new_sizes - 1)
        else:
            src = gsel[k]
            gcols.append(np.asarray(gmaps[k], dtype=np.int64)[data.group[:, dom.group_index(src.name)]])
            k += 1
    pcols = [
        np.asarray(m, dtype=np.int64)[data.person[keep][:, dom.person_index(a.name)]] for a, m in zip(psel, pmaps)
    ]
    group = np.stack(gcols, axis=1) if gcols else np.zeros((data.n_households, 0))
    person = np.stack(pcols, axis=1) if pcols else np.zeros((int(keep.sum()), 0))
    offsets = np.concatenate([[0], np.cumsum(new_sizes)])
    out = HierarchicalData.from_arrays(rdom, data.geo, group, person, offsets)
    spec = ReducedDomainSpec(
        tuple(a.name for a in gsel), tuple(gmaps), tuple(a.name for a in psel), tuple(pmaps), max_size, size_rule, rdom
    )
    return out, spec


# ----------------------------------------------------------------------------------------------
# explicit histogram
# ----------------------------------------------------------------------------------------------


class HouseholdHistogram:
    """Shapes and exact workload answers for the explicit histogram over G × ∪_m I^m (ordered)."""

    def __init__(self, domain: Domain, device: str | torch.device | None = None, max_cells: int = 50_000_000) -> None:
        self.domain = domain
        self.device = resolve_device(device)
        self.gnames = [a.name for a in domain.group if a.name != domain.size_attribute]
        self.gsizes = [domain.group_attribute(n).size for n in self.gnames]
        self.psizes = list(domain.person_sizes)
        self.M = domain.max_size
        self.shapes = [tuple(self.gsizes + self.psizes * m) for m in range(1, self.M + 1)]
        self.numels = [int(math.prod(s)) for s in self.shapes]
        self.n_cells = int(sum(self.numels))
        if self.n_cells > max_cells:
            raise ValueError(f"explicit histogram of {self.n_cells} cells exceeds max_cells={max_cells}")
        self._cmat: dict[tuple[str, int, int], torch.Tensor] = {}

    # -- layout --------------------------------------------------------------------------
    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [t.view(s) for t, s in zip(torch.split(flat, self.numels), self.shapes)]

    def from_data(self, data: HierarchicalData) -> torch.Tensor:
        """Normalised histogram (flat, float64) of a dataset on this (reduced) domain."""
        if data.domain != self.domain:
            raise ValueError("data is not on the histogram's domain")
        dom = self.domain
        gi = [dom.group_index(n) for n in self.gnames]
        sizes = data.sizes
        out = []
        for m in range(1, self.M + 1):
            hh = np.flatnonzero(sizes == m)
            cols = [data.group[hh, j].astype(np.int64) for j in gi]
            start = data.person_offsets[hh]
            for s in range(m):
                for j in range(len(self.psizes)):
                    cols.append(data.person[start + s, j].astype(np.int64))
            if len(cols) == 0:
                idx = np.zeros(len(hh), dtype=np.int64)
            else:
                idx = np.ravel_multi_index(cols, self.shapes[m - 1]) if len(hh) else np.zeros(0, dtype=np.int64)
            out.append(np.bincount(idx, minlength=self.numels[m - 1]).astype(np.float64))
        flat = np.concatenate(out)
        return torch.as_tensor(flat / max(flat.sum(), 1.0), device=self.device)

    def uniform(self, dtype=torch.float64) -> torch.Tensor:
        return torch.full((self.n_cells,), 1.0 / self.n_cells, dtype=dtype, device=self.device)

    def _tuple_matrix(self, level: str, m: int, K: int) -> torch.Tensor:
        key = (level, m, K)
        if key not in self._cmat:
            tuples = np.array(list(itertools.product(range(K), repeat=m)), dtype=np.int64).reshape(-1, m)
            eq = tuples[:, :, None] == np.arange(K)[None, None, :]  # (K^m, m, K)
            c = eq.any(1) if level == "group" else eq.sum(1)
            self._cmat[key] = torch.as_tensor(c.astype(np.float64), device=self.device)
        return self._cmat[key]

    # -- answers ---------------------------------------------------------------------------
    def linear_answers(self, flat: torch.Tensor, w: Workload) -> torch.Tensor:
        """⟨φ_y, A⟩ for every cell y: households (group) or persons (person level), unnormalised."""
        dom = self.domain
        parts = self.split(flat)
        kG, kI = len(self.gnames), len(self.psizes)
        np_pos = w.group_attrs.index(dom.size_attribute) if dom.size_attribute in w.group_attrs else -1
        g_axes = [self.gnames.index(a) for a in w.group_attrs if a != dom.size_attribute]
        p_local = [dom.person_index(a) for a in w.person_attrs]
        K = int(math.prod(dom.person_attribute(a).size for a in w.person_attrs)) if w.person_attrs else 1
        gshape = [self.gsizes[i] for i in g_axes]
        res = []
        for m in range(1, self.M + 1):
            A = parts[m - 1]
            keep = list(g_axes) + [kG + s * kI + j for s in range(m) for j in p_local]
            marg = torch.einsum(A, list(range(A.dim())), keep)  # sum the rest, in workload order
            marg = marg.reshape(int(math.prod(gshape)), K**m if w.person_attrs else 1)
            r = marg @ self._tuple_matrix(w.level, m if w.person_attrs else 1, K)  # (G_S, K)
            if not w.person_attrs and w.level == "person":
                r = r * m
            res.append(r.reshape(gshape + [K]))
        if np_pos >= 0:
            out = torch.stack(res, dim=np_pos)
        else:
            out = torch.stack(res, dim=0).sum(0)
        return out.reshape(-1)

    def expected_persons(self, flat: torch.Tensor) -> torch.Tensor:
        sizes = torch.cat(
            [torch.full((n,), float(m), dtype=flat.dtype, device=flat.device) for m, n in zip(range(1, self.M + 1), self.numels)]
        )
        return (flat * sizes).sum()

    def answers(self, flat: torch.Tensor, w: Workload) -> torch.Tensor:
        """Normalised answers (fractions of households / persons) of a probability histogram."""
        lin = self.linear_answers(flat, w)
        return lin / flat.sum() if w.level == "group" else lin / self.expected_persons(flat)

    def predicate_weights(self, w: Workload, e: torch.Tensor) -> torch.Tensor:
        """Σ_y e_y φ_y(x) for every histogram cell x (the gradient of the linear answers)."""
        x = torch.zeros(self.n_cells, dtype=e.dtype, device=self.device, requires_grad=True)
        (g,) = torch.autograd.grad((self.linear_answers(x, w) * e).sum(), x)
        return g

    def sample(self, flat: torch.Tensor, n: int, seed: int = 0) -> HierarchicalData:
        """n households drawn from the histogram (vectorised), geography all zeros."""
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        idx = torch.multinomial(flat.to(torch.float64), int(n), replacement=True, generator=gen).cpu().numpy()
        bounds = np.cumsum([0] + self.numels)
        m_of = np.searchsorted(bounds, idx, side="right")  # 1..M
        order = np.argsort(m_of, kind="stable")
        dom = self.domain
        groups, persons, sizes = [], [], []
        for m in range(1, self.M + 1):
            sel = idx[order][m_of[order] == m] - bounds[m - 1]
            if sel.size == 0:
                continue
            coords = np.stack(np.unravel_index(sel, self.shapes[m - 1]), axis=1) if self.shapes[m - 1] else np.zeros((sel.size, 0), dtype=np.int64)
            g = np.zeros((sel.size, len(dom.group)), dtype=np.int64)
            for i, name in enumerate(self.gnames):
                g[:, dom.group_index(name)] = coords[:, i]
            g[:, dom.group_index(dom.size_attribute)] = m - 1
            groups.append(g)
            persons.append(coords[:, len(self.gnames):].reshape(sel.size * m, len(self.psizes)))
            sizes.append(np.full(sel.size, m))
        sz = np.concatenate(sizes)
        off = np.concatenate([[0], np.cumsum(sz)])
        return HierarchicalData.from_arrays(
            dom, np.zeros((len(sz), len(dom.geography))), np.concatenate(groups), np.concatenate(persons), off
        )


# ----------------------------------------------------------------------------------------------
# MWEM
# ----------------------------------------------------------------------------------------------


@dataclass
class MWEMConfig:
    rounds: int = 50  # T
    max_update_steps: int = 50  # T_max: at most this many past measurements re-used per round
    seed: int = 0
    output: Literal["average", "average_updates", "last"] = "average"  # paper: avg_t A_{t-1}


@dataclass
class MWEMResult:
    histogram: HouseholdHistogram
    output: torch.Tensor  # the released (averaged) histogram, flat probabilities
    last: torch.Tensor
    measured: list[Workload]
    measurements: list[np.ndarray]
    history: list[dict] = field(default_factory=list)

    def answers(self, w: Workload) -> np.ndarray:
        return self.histogram.answers(self.output, w).cpu().numpy()


def train_mwem(
    domain: Domain,
    workloads: Sequence[Workload],
    true_answers: Sequence[np.ndarray],
    select: Callable[[np.ndarray, float], int],
    measure: Callable[[Workload], np.ndarray],
    score_sensitivity: float,
    config: MWEMConfig | None = None,
    init: HierarchicalData | None = None,
    device: str | torch.device | None = None,
) -> MWEMResult:
    """MWEM with the same injected ``select`` / ``measure`` as H-GEM (see module docstring).

    init: None → uniform A_0 over X (the paper); a public HierarchicalData on ``domain`` →
    its histogram mixed with 1 % uniform (PMW^Pub-style start, keeps full support).
    """
    cfg = config or MWEMConfig()
    H = HouseholdHistogram(domain, device)
    dev = H.device
    gen = np.random.default_rng(cfg.seed)
    if init is None:
        A = H.uniform()
    else:
        A = 0.99 * H.from_data(init) + 0.01 * H.uniform()
    logA = torch.log(A)
    targets = [torch.as_tensor(np.asarray(t, dtype=np.float64).reshape(-1), device=dev) for t in true_answers]
    M = domain.max_size
    measured: list[Workload] = []
    meas: list[torch.Tensor] = []
    history: list[dict] = []
    acc = torch.zeros_like(A)
    n_acc = 0
    for t in range(1, cfg.rounds + 1):
        t0 = time.perf_counter()
        if cfg.output == "average":
            acc += A
            n_acc += 1
        scores = np.array([float((H.answers(A, w) - y).abs().max()) for w, y in zip(workloads, targets)])
        idx = int(select(scores, float(score_sensitivity)))
        w = workloads[idx]
        m = torch.as_tensor(np.asarray(measure(w), dtype=np.float64).reshape(-1), device=dev)
        measured.append(w)
        meas.append(m)
        # MWEM-Update (Algorithm 2)
        errs = np.array([float((mm - H.answers(A, ww)).abs().max()) for ww, mm in zip(measured, meas)])
        top = np.argsort(-errs, kind="stable")[: cfg.max_update_steps]
        chosen = [i for i in top if errs[i] >= errs.max() / 2.0]
        for i in gen.permutation(chosen):
            ww, mm = measured[i], meas[i]
            e = mm - H.answers(A, ww)
            qe = H.predicate_weights(ww, e)
            if ww.level == "person":
                qe = qe / M
            logA = logA + qe / 2.0
            logA = logA - torch.logsumexp(logA, 0)
            A = torch.exp(logA)
        if cfg.output == "average_updates":
            acc += A
            n_acc += 1
        history.append({"round": t, "workload": w.id, "score": float(scores[idx]), "updates": len(chosen),
                        "seconds": time.perf_counter() - t0})
    out = A if cfg.output == "last" else acc / n_acc
    return MWEMResult(H, out, A, measured, [x.cpu().numpy() for x in meas], history)
