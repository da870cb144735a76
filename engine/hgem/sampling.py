"""Two-stage sampling of synthetic households from a product mixture (H-GEM paper §4.2, "Sampling").

For each household: pick a mixture component k uniformly (the B sub-populations are equally
weighted, GEM appendix B.1), draw the group attributes from F_G(z_k) and the size m ~ F_c(z_k),
then draw m persons, the j-th from the slot distribution F_I,j(z_k) ("the first row is sampled
from F_I,1(z_k), the second from F_I,2(z_k), etc."). Slot 1 is the householder (person row 0 of the
household in HierarchicalData). No special handling of a relationship attribute: whatever the
slot-1 head learnt is what the householder gets.

Vectorised: every draw is one ``torch.multinomial`` over all households (persons for all M slots
are drawn and the slots beyond m are dropped by a mask), with a seeded ``torch.Generator``.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.hierarchical_data import HierarchicalData
from engine.hgem.mixture import ProductMixture


def _categorical(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One draw per row of a (n, s) probability matrix, by inverse CDF (float64, on probs' device)."""
    p = probs.to(torch.float64)
    cdf = torch.cumsum(p, dim=-1)
    u = torch.rand(p.shape[0], 1, generator=gen, device=p.device, dtype=torch.float64) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(1)
    return idx.clamp_(max=p.shape[1] - 1)


def sample_households(
    mix: ProductMixture,
    n_households: int,
    seed: int | None = 0,
    generator: torch.Generator | None = None,
    geo: tuple[int, ...] | np.ndarray | None = None,
) -> HierarchicalData:
    """Draw ``n_households`` synthetic households from ``mix`` into a HierarchicalData.

    geo: one node (tuple of codes for every level of ``domain.geography``) given to all
    households, an (n, L) array, or None (all zeros). Randomness comes from ``generator`` if
    given, else from a torch.Generator seeded with ``seed`` on the mixture's device.
    """
    lay = mix.layout
    dom = lay.domain
    dev = mix.device
    if generator is None:
        generator = torch.Generator(device=dev)
        generator.manual_seed(0 if seed is None else int(seed))
    n = int(n_households)
    M = lay.max_size
    with torch.no_grad():
        mix = mix.detach()
        B = mix.n_components
        comp = torch.randint(0, B, (n,), generator=generator, device=dev)
        size_idx = _categorical(mix.size_probs[comp], generator)  # m - 1
        group = torch.empty(n, len(dom.group), dtype=torch.long, device=dev)
        group[:, dom.group_index(dom.size_attribute)] = size_idx
        for name in lay.group_names:
            group[:, dom.group_index(name)] = _categorical(mix.group_probs[comp][:, lay.group_slice(name)], generator)
        # persons: all M slots of every household, then keep slot < m (row-major → CSR order)
        slot_probs = mix.person_probs[comp]  # (n, M, D_I)
        person = torch.empty(n, M, len(dom.person), dtype=torch.long, device=dev)
        for j, name in enumerate(lay.person_names):
            pr = slot_probs[:, :, lay.person_slice(name)].reshape(n * M, -1)
            person[:, :, j] = _categorical(pr, generator).view(n, M)
        keep = torch.arange(M, device=dev).unsqueeze(0) <= size_idx.unsqueeze(1)  # (n, M)
        persons = person[keep]  # row-major: household by household, slot order
        sizes = (size_idx + 1).cpu().numpy()
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    L = len(dom.geography)
    if geo is None:
        geo_arr = np.zeros((n, L), dtype=np.int32)
    else:
        g = np.asarray(geo, dtype=np.int32)
        geo_arr = np.broadcast_to(g.reshape(1, L), (n, L)) if g.ndim == 1 else g
    return HierarchicalData.from_arrays(dom, geo_arr, group.cpu().numpy(), persons.cpu().numpy(), offsets)
