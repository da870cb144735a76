"""The H-GEM generator F: a residual MLP with heads F_c, F_G, F_I,1 … F_I,M.

H-GEM paper §4.2 ("we use an MLP (with residual connections) for F", A.2.2: "a multi-headed MLP
with two hidden layers (size 256 and 512)"). The residual block follows the GEM / CTGAN generator:
``x ↦ concat(ReLU(Linear(x)), x)``, so every layer sees the latent input and all earlier features.

Each head is followed by a softmax *per attribute* (GEM appendix B.1: "G(z) outputs a distribution
over each attribute"), so F(z_k) is a product distribution. Following GEM appendix B.2
("fixing the noise vector z at the beginning of training leads to faster convergence"), the
generator owns a fixed batch of B latent vectors z ~ N(0, I) drawn from a seeded torch.Generator;
``forward()`` returns the mixture over those B components (:class:`ProductMixture`), weighted by
``softmax(component_logits)`` — uniform, as in the paper, unless a training step moves them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.data import Domain
from engine.hgem.mixture import MixtureLayout, ProductMixture, resolve_device


class ResidualBlock(nn.Module):
    """CTGAN/GEM residual layer: ``concat(ReLU(Linear(x)), x)``."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(in_dim, out_dim)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.act(self.fc(x)), x], dim=1)


class SegmentSoftmax(nn.Module):
    """Softmax over each consecutive segment of the last axis (one segment per attribute).

    One padded softmax for all segments: the logits are gathered into (…, n_segments, widest)
    with −inf in the padding, soft-maxed along the last axis and gathered back. Equal to a softmax
    per segment, in a fixed handful of kernels whatever the number of attributes (the per-segment
    loop launched three per attribute, forward and backward, and H-GEM's GPU steps are launch-bound).
    """

    # registered buffers (declared for the type checker: nn.Module.__getattr__ is typed Tensor | Module)
    gather: torch.Tensor
    padding: torch.Tensor
    back: torch.Tensor

    def __init__(self, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.sizes = tuple(int(s) for s in sizes)
        width, n, pad = sum(self.sizes), len(self.sizes), max(self.sizes, default=1)
        gather = torch.zeros(n, pad, dtype=torch.long)
        valid = torch.zeros(n, pad, dtype=torch.bool)
        back = torch.zeros(width, dtype=torch.long)
        start = 0
        for i, s in enumerate(self.sizes):
            gather[i, :s] = torch.arange(start, start + s)
            valid[i, :s] = True
            back[start : start + s] = i * pad + torch.arange(s)
            start += s
        self.register_buffer("gather", gather.reshape(-1), persistent=False)
        self.register_buffer("padding", ~valid, persistent=False)
        self.register_buffer("back", back, persistent=False)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.sizes:
            return logits
        lead = logits.shape[:-1]
        padded = logits.index_select(-1, self.gather).view(*lead, *self.padding.shape)
        probs = torch.softmax(padded.masked_fill(self.padding, float("-inf")), dim=-1)
        return probs.flatten(-2).index_select(-1, self.back)


class HGEMGenerator(nn.Module):
    """F: fixed latent batch z (B, z_dim) → :class:`ProductMixture` with B components.

    Parameters
    ----------
    domain      the hierarchical domain; ``domain.size_attribute`` (NP) is modelled by F_c.
    batch_size  B, the number of mixture components (GEM used B = 1000).
    z_dim       latent dimension.
    hidden      widths of the residual layers (paper: (256, 512)).
    seed        seed of the torch.Generator that draws z and the initial weights.
    device      ``None`` → cuda if available, else cpu.
    """

    z: torch.Tensor  # registered buffer (declared for the type checker: nn.Module.__getattr__ is typed Tensor | Module)

    def __init__(
        self,
        domain: Domain,
        batch_size: int = 1000,
        z_dim: int = 64,
        hidden: tuple[int, ...] = (256, 512),
        seed: int = 0,
        device: str | torch.device | None = None,
    ) -> None:
        super().__init__()
        self.domain = domain
        self.layout = MixtureLayout.from_domain(domain)
        self.batch_size = int(batch_size)
        self.z_dim = int(z_dim)
        self.hidden = tuple(int(h) for h in hidden)
        self.seed = int(seed)
        dev = resolve_device(device)
        M = domain.max_size
        # deterministic initialisation independent of the global RNG
        fork_devices = [dev] if dev.type == "cuda" else []
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(self.seed)
            layers: list[nn.Module] = []
            dim = self.z_dim
            for h in self.hidden:
                layers.append(ResidualBlock(dim, h))
                dim += h
            self.body = nn.Sequential(*layers)
            self.head_size = nn.Linear(dim, M)  # F_c
            self.head_group = nn.Linear(dim, max(self.layout.group_width, 1))  # F_G
            self.head_person = nn.Linear(dim, M * self.layout.person_width)  # F_I,1..F_I,M
        self.group_softmax = SegmentSoftmax(self.layout.group_sizes)
        self.person_softmax = SegmentSoftmax(self.layout.person_sizes)
        # component weights w = softmax(component_logits): uniform (the paper's mixture) until the
        # private MAP update moves them (see engine.hgem.train); public pretraining keeps them uniform
        self.component_logits = nn.Parameter(torch.zeros(self.batch_size))
        g = torch.Generator().manual_seed(self.seed + 7919)
        self.register_buffer("z", torch.randn(self.batch_size, self.z_dim, generator=g))
        self.to(dev)

    @property
    def device(self) -> torch.device:
        return self.z.device

    def forward(self, z: torch.Tensor | None = None) -> ProductMixture:
        z = self.z if z is None else z
        h = self.body(z)
        B = z.shape[0]
        lay = self.layout
        size_probs = torch.softmax(self.head_size(h), dim=-1)
        group_logits = self.head_group(h)[:, : lay.group_width]
        group_probs = self.group_softmax(group_logits)
        person_logits = self.head_person(h).view(B, lay.max_size, lay.person_width)
        person_probs = self.person_softmax(person_logits)
        weights = torch.softmax(self.component_logits, dim=0) if B == self.batch_size else None
        return ProductMixture(lay, size_probs, group_probs, person_probs, weights)

    def config(self) -> dict[str, Any]:
        """The constructor arguments except the domain (enough to rebuild it with a state_dict)."""
        return {"batch_size": self.batch_size, "z_dim": self.z_dim, "hidden": list(self.hidden), "seed": self.seed}
