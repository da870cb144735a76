"""Differentiable answers f_q of hierarchical marginal workloads on a product mixture.

H-GEM paper §4.2, Eq. (1) and the two displayed forms of f_q. For one mixture component k with
size distribution c_k = F_c(z_k), group distribution F_G(z_k) and slot distributions F_I,j(z_k),
write p_kj(y_I) = Π_{i∈S_I} F_I,j(z_k)_i[y_i] (the chance that the person in slot j matches y_I).

* group level ("households matching y_G that contain a person matching y_I"):
      f = Σ_k w_k Π_{i∈S_G} F_G(z_k)_i[y_i] · Σ_m c_km (1 − Π_{j≤m} (1 − p_kj(y_I)))
  Only the slots j ≤ m of a household of size m count; the inner sum is computed for all m at
  once with a cumulative product over slots, so it is exact for the mixture (no independence
  approximation between the size and the slots).
* person level ("persons matching y_I whose household matches y_G"), the ratio form:
      f = Σ_k w_k Π_{i∈S_G} F_G(z_k)_i[y_i] · Σ_m c_km Σ_{j≤m} p_kj(y_I)  /  Σ_k w_k Σ_m m c_km
  = expected number of matching persons / expected number of persons
  (Σ_m c_km Σ_{j≤m} p_kj = Σ_j P_k(size ≥ j) p_kj).
  (w_k the component weights, 1/B in the paper's uniform mixture.)
* S_I = ∅: the "contains" factor is 1 (group level) and the person count is m (person level).
* NP (``domain.size_attribute``) is a group attribute whose distribution is F_c: when NP ∈ S_G the
  sum over m is not taken; the term for m goes to the cell NP = m.

Group-level answers are fractions of households (exact counts / N_G), person-level answers
fractions of persons (exact counts / N_I): :func:`exact_normalised_answers` gives the targets in
the same units from ``engine.queries._queries.answer``.

Everything is vectorised: all cells of a workload at once, and all workloads of equal "shape"
(level, position of NP, attribute sizes) batched together in one einsum on the mixture's device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from engine.data import Domain, HierarchicalData
from engine.hgem.mixture import MixtureLayout, ProductMixture, resolve_device
from engine.queries import Workload, answer

_Flat = TypeVar("_Flat", torch.Tensor, np.ndarray)


def exact_normalised_answers(data: HierarchicalData, workloads: Sequence[Workload]) -> list[np.ndarray]:
    """Exact answers as fractions: group level / N_G, person level / N_I (H-GEM §3)."""
    out = []
    for w in workloads:
        denom = data.n_households if w.level == "group" else data.n_persons
        out.append(answer(data, w) / max(denom, 1))
    return out


@dataclass
class _Bucket:
    level: str
    np_pos: int  # position of NP inside w.group_attrs, -1 when absent
    group_sizes: tuple[int, ...]  # non-NP group attributes, workload order
    person_sizes: tuple[int, ...]
    members: list[int]
    gidx: list[torch.Tensor]  # each (W, s): columns of group_probs
    pidx: list[torch.Tensor]  # each (W, t): columns of person_probs
    n_cells: int


_BucketKey = tuple[str, int, tuple[int, ...], tuple[int, ...]]  # level, NP position, group sizes, person sizes


class AnswerPlan:
    """Pre-computed index tensors to answer a fixed list of workloads on any ProductMixture.

    ``answers(mix)`` returns one flat tensor: the normalised answers of ``workloads[i]`` (cells in
    ``engine.queries._queries`` C order) are ``flat[offsets[i]:offsets[i+1]]``.
    ``max_elements`` caps the size of the largest intermediate (B·M·W·K) by chunking buckets.
    """

    def __init__(
        self,
        domain: Domain,
        workloads: Sequence[Workload],
        device: str | torch.device | None = None,
        max_elements: int = 1 << 24,
    ) -> None:
        self.domain = domain
        self.layout = MixtureLayout.from_domain(domain)
        self.workloads = list(workloads)
        self.device = resolve_device(device)
        self.max_elements = int(max_elements)
        plain = [w.id for w in self.workloads if w.first or w.normalised]
        if plain:
            raise ValueError(f"H-GEM answers plain counts of every person: no `first` or normalised workloads ({', '.join(plain[:3])})")
        sizes = [w.n_cells(domain) for w in self.workloads]
        self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self.n_cells = int(self.offsets[-1])
        self.segment_ids = torch.repeat_interleave(
            torch.arange(len(self.workloads), device=self.device), torch.as_tensor(sizes, device=self.device)
        )
        is_person = torch.tensor([w.level == "person" for w in self.workloads], device=self.device)
        self._has_person = any(w.level == "person" for w in self.workloads)  # host-side: no sync in answers()
        self._person_cells = is_person[self.segment_ids]
        lay = self.layout
        buckets: dict[_BucketKey, _Bucket] = {}
        gstarts: dict[_BucketKey, list[list[int]]] = {}  # per bucket, per member: first column of each attribute
        pstarts: dict[_BucketKey, list[list[int]]] = {}
        for i, w in enumerate(self.workloads):
            np_pos = w.group_attrs.index(domain.size_attribute) if domain.size_attribute in w.group_attrs else -1
            gnames = [a for a in w.group_attrs if a != domain.size_attribute]
            gs = tuple(domain.group_attribute(a).size for a in gnames)
            ps = tuple(domain.person_attribute(a).size for a in w.person_attrs)
            key: _BucketKey = (w.level, np_pos, gs, ps)
            b = buckets.get(key)
            if b is None:
                b = buckets[key] = _Bucket(w.level, np_pos, gs, ps, [], [], [], w.n_cells(domain))
                gstarts[key], pstarts[key] = [], []
            b.members.append(i)
            gstarts[key].append([lay.group_offsets[lay.group_names.index(a)] for a in gnames])
            pstarts[key].append([lay.person_offsets[lay.person_names.index(a)] for a in w.person_attrs])
        self._buckets: list[_Bucket] = []
        order: list[int] = []
        for key, b in buckets.items():
            starts_g = torch.as_tensor(gstarts[key], dtype=torch.long).reshape(len(b.members), len(b.group_sizes))
            starts_p = torch.as_tensor(pstarts[key], dtype=torch.long).reshape(len(b.members), len(b.person_sizes))
            b.gidx = [(starts_g[:, j : j + 1] + torch.arange(s)).to(self.device) for j, s in enumerate(b.group_sizes)]
            b.pidx = [(starts_p[:, j : j + 1] + torch.arange(s)).to(self.device) for j, s in enumerate(b.person_sizes)]
            self._buckets.append(b)
            for i in b.members:
                order.extend(range(int(self.offsets[i]), int(self.offsets[i + 1])))
        # flat position (bucket concatenation order) -> workload order
        perm = torch.empty(self.n_cells, dtype=torch.long)
        perm[torch.as_tensor(order, dtype=torch.long)] = torch.arange(self.n_cells)
        self._gather = perm.to(self.device)

    # ------------------------------------------------------------------------------------
    def _bucket_answers(self, mix: ProductMixture, b: _Bucket, rows: slice) -> torch.Tensor:
        c = mix.size_probs
        B, M = c.shape
        dev, dt = c.device, c.dtype
        W = rows.stop - rows.start
        # index_select rather than advanced indexing: its backward is an index_add, where
        # indexing's backward sorts the indices (a third of a GPU step's time)
        gfac = [mix.group_probs.index_select(1, idx[rows].reshape(-1)).view(B, W, -1) for idx in b.gidx]  # (B, W, s)
        if b.person_sizes:
            # one index tensor per person attribute (b.pidx is built from b.person_sizes)
            pfac = [mix.person_probs.index_select(2, idx[rows].reshape(-1)).view(B, M, W, -1) for idx in b.pidx]  # (B, M, W, t)
            p = pfac[0]
            for q in pfac[1:]:
                p = (p.unsqueeze(-1) * q.unsqueeze(-2)).flatten(-2)
            if b.level == "group":
                # contains within the first m slots: 1 − Π_{j≤m} (1 − p_j), the product as exp Σ log
                # (cumprod's backward checks its input for zeros on the host, a sync that a CUDA
                # graph cannot capture; the clamp only touches p = 1 exactly, a saturated softmax)
                h = 1.0 - torch.exp(torch.cumsum(torch.log((1.0 - p).clamp_min(1e-30)), dim=1))
            else:
                h = torch.cumsum(p, dim=1)  # expected matching persons among the first m slots
        else:
            if b.level == "group":
                h = torch.ones(1, M, 1, 1, device=dev, dtype=dt)
            else:
                h = torch.arange(1, M + 1, device=dev, dtype=dt).view(1, M, 1, 1)
            h = h.expand(B, M, W, 1)
        s = (mix.component_weights[:, None] * c)[:, :, None, None] * h  # (B, M, W, K), weighted components
        ops: list[torch.Tensor | list[int]] = []  # einsum's (operand, axes) pairs
        out_axes: list[int] = [1]
        gi = 0
        n_group = len(b.group_sizes) + (1 if b.np_pos >= 0 else 0)
        for pos in range(n_group):
            if pos == b.np_pos:
                out_axes.append(2)
            else:
                ops += [gfac[gi], [0, 1, 10 + gi]]
                out_axes.append(10 + gi)
                gi += 1
        ops += [s, [0, 2, 1, 3]]
        out_axes.append(3)
        res = torch.einsum(*ops, out_axes)  # (W, ..., K); m is summed out unless NP ∈ S_G
        return res.reshape(W, b.n_cells)

    def answers(self, mix: ProductMixture) -> torch.Tensor:
        """Normalised answers of all workloads, one flat tensor (differentiable)."""
        if mix.layout.domain != self.domain:
            raise ValueError("mixture and plan have different domains")
        B, M = mix.size_probs.shape
        parts = []
        for b in self._buckets:
            K = int(math.prod(b.person_sizes)) if b.person_sizes else 1
            per = max(B * M * K, B * b.n_cells)
            chunk = max(1, self.max_elements // max(per, 1))
            n = len(b.members)
            for start in range(0, n, chunk):
                parts.append(self._bucket_answers(mix, b, slice(start, min(n, start + chunk))).reshape(-1))
        flat = torch.cat(parts).index_select(0, self._gather)
        if self._has_person:
            scale = torch.where(self._person_cells, 1.0 / mix.expected_size(), torch.ones((), device=flat.device))
            flat = flat * scale
        return flat

    def split(self, flat: _Flat) -> list[_Flat]:
        return [flat[int(self.offsets[i]) : int(self.offsets[i + 1])] for i in range(len(self.workloads))]

    def concat_targets(self, targets: Sequence[np.ndarray], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Flatten per-workload target vectors (same order as the plan) onto the plan's device."""
        if len(targets) != len(self.workloads):
            raise ValueError("one target vector per workload")
        arr = np.concatenate([np.asarray(t, dtype=np.float64).reshape(-1) for t in targets]) if targets else np.zeros(0)
        if arr.shape[0] != self.n_cells:
            raise ValueError(f"targets have {arr.shape[0]} cells, plan has {self.n_cells}")
        return torch.as_tensor(arr, dtype=dtype, device=self.device)

    def max_abs_error(self, flat: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-workload max |answer − target| (the error of the workload's worst query)."""
        err = (flat - target).abs()
        out = torch.zeros(len(self.workloads), device=err.device, dtype=err.dtype)
        return out.scatter_reduce(0, self.segment_ids, err, reduce="amax", include_self=True)

    def l2_error(self, flat: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-workload ‖answer − target‖₂ (the terms of the H-GEM loss, Eq. 1)."""
        sq = (flat - target) ** 2
        out = torch.zeros(len(self.workloads), device=sq.device, dtype=sq.dtype)
        # small epsilon keeps the gradient of sqrt finite at a perfect fit
        return torch.sqrt(out.index_add(0, self.segment_ids, sq) + 1e-12)


def workload_answers(mix: ProductMixture, workloads: Sequence[Workload]) -> list[torch.Tensor]:
    """Convenience: normalised answers of each workload on ``mix`` (one tensor per workload)."""
    plan = AnswerPlan(mix.layout.domain, workloads, device=mix.device)
    return plan.split(plan.answers(mix))
