"""Two-stage sampling of synthetic households from a product mixture (H-GEM paper §4.2, "Sampling").

For each household: pick a mixture component k (by its weight; the B sub-populations of GEM
appendix B.1 are equally weighted until the private update moves the weights), draw the group
attributes from F_G(z_k) and the size m ~ F_c(z_k), then draw m persons, the j-th from the slot distribution F_I,j(z_k) ("the first row is sampled
from F_I,1(z_k), the second from F_I,2(z_k), etc."). Slot 1 is the householder (person row 0 of the
household in HierarchicalData). No special handling of a relationship attribute: whatever the
slot-1 head learnt is what the householder gets.

Low-variance sampling (each household is still, marginally, a draw from the mixture; only the
dependence *between* households changes, to cut the sampling noise of every released answer):

* components are allocated in balance (stratified sampling over the B component strata): every
  component gets ⌊n w_k⌋ or ⌈n w_k⌉ households (⌊n/B⌋ or ⌈n/B⌉ for the uniform mixture), and the
  assignment is shuffled — no multinomial spread of the component counts. Which components get
  the one extra household is decided by systematic sampling (one random start) along the
  components sorted by their most likely household (:func:`component_order`: size, then the group
  attributes, then the first person's attributes), the survey practice of implicit stratification:
  the households sampled with a given modal size (and, within it, modal first group attribute …)
  are then within one of their expected number, even when n w_k < 1 for every component;
* inside a component, every attribute is drawn by inverse CDF from stratified uniforms (Latin
  hypercube sampling): the c households of a component (c persons of one slot) get the strata
  [r/c, (r+1)/c), r = 0..c−1, in a random order of their own for each attribute, so that a
  component's draws cover its distribution evenly. Strata are permuted independently per
  attribute, so the attributes of one household stay independent given its component.

Both cut the sampling noise well below i.i.d. draws (measurements: ``benchmarks/results/HISTORY.md``).

Vectorised: every attribute is one inverse-CDF draw over all households (persons for all M slots
are drawn and the slots beyond m are dropped by a mask), with a seeded ``torch.Generator``.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.hgem.mixture import ProductMixture
from engine.hierarchical_data import HierarchicalData


def stratified_uniforms(strata: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One U(0, 1) value per row; the c rows sharing a stratum label get one point in each of
    [r/c, (r+1)/c), r = 0..c−1, in random order (so each row is marginally uniform)."""
    n = int(strata.shape[0])
    dev = strata.device
    perm = torch.randperm(n, generator=gen, device=dev)
    order = perm[torch.argsort(strata[perm], stable=True)]  # grouped by label, random within
    s = strata[order]
    first = torch.ones(n, dtype=torch.bool, device=dev)
    first[1:] = s[1:] != s[:-1]
    idx = torch.arange(n, device=dev)
    rank = idx - torch.cummax(torch.where(first, idx, torch.zeros_like(idx)), 0).values
    count = torch.bincount(s)[s]
    u_sorted = (rank.to(torch.float64) + torch.rand(n, generator=gen, device=dev, dtype=torch.float64)) / count
    u = torch.empty(n, dtype=torch.float64, device=dev)
    u[order] = u_sorted
    return u


def _categorical(probs: torch.Tensor, gen: torch.Generator, strata: torch.Tensor) -> torch.Tensor:
    """One draw per row of a (n, s) probability matrix, by inverse CDF of stratified uniforms
    (float64, on probs' device)."""
    p = probs.to(torch.float64)
    cdf = torch.cumsum(p, dim=-1)
    u = stratified_uniforms(strata, gen).unsqueeze(1) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).squeeze(1)
    return idx.clamp_(max=p.shape[1] - 1)


def component_order(mix: ProductMixture) -> torch.Tensor:
    """The components sorted by their most likely household: modal size, then the modal value of
    each group attribute, then of each person attribute of the first slot (lexicographic, stable)."""
    lay = mix.layout
    keys = [mix.size_probs.argmax(1)]
    keys += [mix.group_probs[:, lay.group_slice(a)].argmax(1) for a in lay.group_names]
    keys += [mix.person_probs[:, 0, lay.person_slice(a)].argmax(1) for a in lay.person_names]
    order = torch.arange(mix.n_components, device=mix.device)
    for key in reversed(keys):  # least significant first; stable sorts keep the earlier keys' order
        order = order[torch.sort(key[order], stable=True).indices]
    return order


def balanced_components(n: int, weights: torch.Tensor, generator: torch.Generator, order: torch.Tensor) -> torch.Tensor:
    """Component of each of ``n`` households: component k gets ⌊n w_k⌋ or ⌈n w_k⌉ households (the
    fractional parts n w_k − ⌊n w_k⌋ decide, by systematic sampling along ``order`` — a permutation
    of the components, :func:`component_order` — which components get one more), in random order
    (module doc). Each household's component is marginally distributed as w."""
    dev = weights.device
    B = int(weights.shape[0])
    w = weights.detach().to(torch.float64).clamp_min(0)
    expected = int(n) * w / w.sum()
    base = torch.floor(expected)
    rest = int(n) - int(base.sum().item())
    counts = base.to(torch.long)
    if rest > 0:
        perm = order.to(dev)
        cdf = torch.cumsum((expected - base)[perm], 0)
        u = torch.rand(1, generator=generator, device=dev, dtype=torch.float64) + torch.arange(rest, device=dev)
        picked = perm[torch.searchsorted(cdf, u.clamp_max(cdf[-1] - 1e-9), right=True).clamp_max(B - 1)]
        counts.index_add_(0, picked, torch.ones_like(picked))
    comp = torch.repeat_interleave(torch.arange(B, device=dev), counts)
    return comp[torch.randperm(int(n), generator=generator, device=dev)]


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
        comp = balanced_components(n, mix.component_weights, generator, component_order(mix))
        size_idx = _categorical(mix.size_probs[comp], generator, comp)  # m - 1
        group = torch.empty(n, len(dom.group), dtype=torch.long, device=dev)
        group[:, dom.group_index(dom.size_attribute)] = size_idx
        group_probs = mix.group_probs[comp]  # (n, D_G), gathered once for all attributes
        for name in lay.group_names:
            group[:, dom.group_index(name)] = _categorical(group_probs[:, lay.group_slice(name)], generator, comp)
        # persons: all M slots of every household, then keep slot < m (row-major → CSR order)
        slot_probs = mix.person_probs[comp]  # (n, M, D_I)
        person = torch.empty(n, M, len(dom.person), dtype=torch.long, device=dev)
        slot_strata = (comp.unsqueeze(1) * M + torch.arange(M, device=dev)).reshape(-1)  # (component, slot)
        for j, name in enumerate(lay.person_names):
            pr = slot_probs[:, :, lay.person_slice(name)].reshape(n * M, -1)
            person[:, :, j] = _categorical(pr, generator, slot_strata).view(n, M)
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
