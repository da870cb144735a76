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

import torch

from engine.domain import Domain


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
    def from_domain(cls, domain: Domain) -> "MixtureLayout":
        g = [a for a in domain.group if a.name != domain.size_attribute]
        gs = tuple(a.size for a in g)
        ps = tuple(a.size for a in domain.person)
        cum = lambda s: tuple(int(sum(s[:i])) for i in range(len(s)))  # noqa: E731
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
    """

    layout: MixtureLayout
    size_probs: torch.Tensor
    group_probs: torch.Tensor
    person_probs: torch.Tensor

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

    @property
    def n_components(self) -> int:
        return int(self.size_probs.shape[0])

    @property
    def device(self) -> torch.device:
        return self.size_probs.device

    def detach(self) -> "ProductMixture":
        return ProductMixture(self.layout, self.size_probs.detach(), self.group_probs.detach(), self.person_probs.detach())

    def to(self, device) -> "ProductMixture":
        return ProductMixture(
            self.layout, self.size_probs.to(device), self.group_probs.to(device), self.person_probs.to(device)
        )

    def expected_size(self) -> torch.Tensor:
        """E[m] under the mixture: expected persons per household (the person-level normaliser)."""
        m = torch.arange(1, self.layout.max_size + 1, device=self.device, dtype=self.size_probs.dtype)
        return (self.size_probs * m).sum(1).mean()
