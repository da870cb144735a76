"""The H-GEM output family: a uniform mixture of B product distributions over households.

H-GEM paper (Liu & Wu, "Towards differentially private query release for hierarchical data"),
§4.2: for every latent vector z_k the network F outputs three heads,

- F_c(z_k)   a distribution over the household size m ∈ 1..M (the size attribute ``NP``),
- F_G(z_k)   a product distribution over the group attributes other than ``NP``,
- F_I,j(z_k) for every person slot j = 1..M a product distribution over the person attributes,

and the synthetic population is the uniform mixture over k = 1..B of the product distributions
("GEM models B sub-populations", GEM appendix B.1). This module fixes the tensor layout shared by
the generator, the differentiable answers, sampling and the benchmarks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engine.data import Domain, HierarchicalData


def default_device() -> torch.device:
    """``cuda`` when a GPU is visible, ``cpu`` otherwise."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(device: str | torch.device | None) -> torch.device:
    return default_device() if device is None else torch.device(device)


@dataclass(frozen=True)
class MixtureLayout:
    """Where each attribute's probabilities live in the flat head outputs.

    ``group_names`` are the group attributes other than the size attribute, in domain order;
    ``group_offsets[i]`` is the start of attribute i in the flat ``group_probs`` vector (width
    ``group_sizes[i]``). The same for persons: every slot uses the same flat person layout.
    """

    domain: Domain
    group_names: tuple[str, ...]
    group_sizes: tuple[int, ...]
    group_offsets: tuple[int, ...]
    person_names: tuple[str, ...]
    person_sizes: tuple[int, ...]
    person_offsets: tuple[int, ...]

    @classmethod
    def from_domain(cls, domain: Domain) -> MixtureLayout:
        g = [a for a in domain.group if a.name != domain.size_attribute]
        gs = tuple(a.size for a in g)
        ps = tuple(a.size for a in domain.person)

        def cum(s: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(int(sum(s[:i])) for i in range(len(s)))

        return cls(domain, tuple(a.name for a in g), gs, cum(gs), tuple(a.name for a in domain.person), ps, cum(ps))

    @property
    def max_size(self) -> int:
        return self.domain.max_size

    @property
    def group_width(self) -> int:
        return int(sum(self.group_sizes))

    @property
    def person_width(self) -> int:
        return int(sum(self.person_sizes))

    def group_slice(self, name: str) -> slice:
        i = self.group_names.index(name)
        return slice(self.group_offsets[i], self.group_offsets[i] + self.group_sizes[i])

    def person_slice(self, name: str) -> slice:
        i = self.person_names.index(name)
        return slice(self.person_offsets[i], self.person_offsets[i] + self.person_sizes[i])


@dataclass
class ProductMixture:
    """Uniform mixture of B product distributions over households (H-GEM §4.2).

    size_probs   (B, M)        P_k(size = m), column m-1
    group_probs  (B, D_G)      concatenated per-attribute distributions (group attrs except NP)
    person_probs (B, M, D_I)   slot j (0-based; slot 0 = householder) concatenated per-attribute
    weights      (B,) or None  component weights summing to 1; None = the paper's uniform 1/B
    """

    layout: MixtureLayout
    size_probs: torch.Tensor
    group_probs: torch.Tensor
    person_probs: torch.Tensor
    weights: torch.Tensor | None = None

    def __post_init__(self) -> None:
        B, M = self.size_probs.shape
        lay = self.layout
        if M != lay.max_size:
            raise ValueError(f"size_probs must have M={lay.max_size} columns, got {M}")
        if self.group_probs.shape != (B, lay.group_width):
            raise ValueError(f"group_probs must be ({B}, {lay.group_width}), got {tuple(self.group_probs.shape)}")
        if self.person_probs.shape != (B, M, lay.person_width):
            raise ValueError(
                f"person_probs must be ({B}, {M}, {lay.person_width}), got {tuple(self.person_probs.shape)}"
            )
        if self.weights is not None and self.weights.shape != (B,):
            raise ValueError(f"weights must be ({B},), got {tuple(self.weights.shape)}")

    @property
    def component_weights(self) -> torch.Tensor:
        """(B,) weights of the components (uniform when ``weights`` is None)."""
        if self.weights is not None:
            return self.weights
        B = self.n_components
        return torch.full((B,), 1.0 / B, device=self.device, dtype=self.size_probs.dtype)

    @property
    def n_components(self) -> int:
        return int(self.size_probs.shape[0])

    @property
    def device(self) -> torch.device:
        return self.size_probs.device

    def detach(self) -> ProductMixture:
        w = None if self.weights is None else self.weights.detach()
        return ProductMixture(self.layout, self.size_probs.detach(), self.group_probs.detach(), self.person_probs.detach(), w)

    def to(self, device: torch.device | str) -> ProductMixture:
        w = None if self.weights is None else self.weights.to(device)
        return ProductMixture(
            self.layout, self.size_probs.to(device), self.group_probs.to(device), self.person_probs.to(device), w
        )

    def expected_size(self) -> torch.Tensor:
        """E[m] under the mixture: expected persons per household (the person-level normaliser)."""
        m = torch.arange(1, self.layout.max_size + 1, device=self.device, dtype=self.size_probs.dtype)
        return (self.component_weights * (self.size_probs * m).sum(1)).sum()


def component_kl(p: ProductMixture, q: ProductMixture, floor: float = 1e-12) -> torch.Tensor:
    """KL(P_k ‖ Q_k) of every component k, over whole households: shape (B,).

    A component is a product distribution over households: size m ~ F_c, group attributes ~ F_G,
    and persons in slots 1..m, slot j ~ F_I,j independently of m. Its relative entropy is therefore

        KL(size) + Σ_a KL(group attribute a) + Σ_j P_k(m ≥ j) Σ_a KL(slot j, person attribute a),

    (the slot-j persons exist only when m ≥ j). By joint convexity the mean over k bounds the KL of
    the uniform mixtures from above, so ``component_kl(p, q).mean()`` is a conservative relative
    entropy of the whole synthetic population to a reference (e.g. the public fit). Differentiable
    in ``p``; ``q`` is treated as a constant.
    """
    if p.layout != q.layout or p.n_components != q.n_components:
        raise ValueError("mixtures must share the layout and the number of components")

    def kl_terms(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * (torch.log(a.clamp_min(floor)) - torch.log(b.detach().clamp_min(floor)))

    size = kl_terms(p.size_probs, q.size_probs).sum(-1)
    group = kl_terms(p.group_probs, q.group_probs).sum(-1)
    slots = kl_terms(p.person_probs, q.person_probs).sum(-1)  # (B, M)
    survival = torch.flip(torch.cumsum(torch.flip(p.size_probs, [-1]), -1), [-1])  # P(m ≥ j), j = 1..M
    return size + group + (survival * slots).sum(-1)


def mixture_kl_bound(p: ProductMixture, q: ProductMixture, floor: float = 1e-12) -> torch.Tensor:
    """An upper bound of KL(p ‖ q) for mixtures with the same components' index (the chain rule on
    (component, household) and the data-processing inequality):

        KL(p ‖ q) ≤ KL(w_p ‖ w_q) + Σ_k w_p,k KL(P_k ‖ Q_k).

    Moving weight between components costs only the first term, so a population shift that the
    reference mixture already contains as a component (more households like component k) is cheap,
    as in the prior update's reweighting of a support; changing a component costs its own KL.
    Equals ``component_kl(p, q).mean()`` when both mixtures are uniform."""
    wp, wq = p.component_weights, q.component_weights.detach()
    kl_w = (wp * (torch.log(wp.clamp_min(floor)) - torch.log(wq.clamp_min(floor)))).sum()
    return kl_w + (wp * component_kl(p, q, floor)).sum()


class HouseholdCells:
    """Where each household of a HierarchicalData sits in a mixture's layout: for household k the
    size index m_k − 1, the columns of its group values in ``group_probs`` and, for each of its
    person slots, the columns of its person values in ``person_probs`` (``slot_mask``: the slots
    j < m_k that hold a person). Built once, vectorised; tensors on ``device``."""

    def __init__(self, layout: MixtureLayout, data: HierarchicalData, device: torch.device | str) -> None:
        dom = layout.domain
        if data.domain != dom:
            raise ValueError("data and mixture have different domains")
        n, M = data.n_households, layout.max_size
        gcols = [layout.group_offsets[i] + data.group[:, dom.group_index(a)].astype("int64")
                 for i, a in enumerate(layout.group_names)]
        pcols = torch.zeros(n, M, len(layout.person_names), dtype=torch.long)
        hh = torch.as_tensor(data.person_household)
        slot = torch.as_tensor(data.person_slot)
        for j, a in enumerate(layout.person_names):
            pcols[hh, slot, j] = torch.as_tensor(layout.person_offsets[j] + data.person[:, dom.person_index(a)].astype("int64"))
        mask = torch.zeros(n, M, dtype=torch.bool)
        mask[hh, slot] = True
        self.n_households = n
        self.size_index = torch.as_tensor(data.sizes - 1, dtype=torch.long).to(device)
        self.group_columns = (torch.as_tensor(np.stack(gcols, 1)) if gcols
                              else torch.zeros(n, 0, dtype=torch.long)).to(device)
        self.person_columns = pcols.to(device)
        self.slot_mask = mask.to(device)
        # factors of each household's probability: its size, its group values, its persons' values
        self.n_factors = int(n * (1 + len(layout.group_names)) + int(mask.sum()) * len(layout.person_names))


def household_log_likelihood(mix: ProductMixture, cells: HouseholdCells, floor: float = 1e-30) -> torch.Tensor:
    """log P_k(household k) for every component k: (B,), with B = the households of ``cells``.

    Component k is a product distribution over households, so the probability of household k
    (size m_k, group values, and the person in each slot j < m_k) is
    P_k(size = m_k) · Π_a F_G(z_k)_a[y_a] · Π_{j<m_k} Π_a F_I,j(z_k)_a[y_ja]. Differentiable."""
    if mix.n_components != cells.n_households:
        raise ValueError(f"{mix.n_components} components for {cells.n_households} households")

    def log(p: torch.Tensor) -> torch.Tensor:
        return torch.log(p.clamp_min(floor))

    ll = log(mix.size_probs.gather(1, cells.size_index[:, None])).squeeze(1)
    ll = ll + log(mix.group_probs.gather(1, cells.group_columns)).sum(1)
    persons = log(mix.person_probs.gather(2, cells.person_columns)).sum(2)  # (B, M)
    return ll + torch.where(cells.slot_mask, persons, torch.zeros((), device=persons.device)).sum(1)
