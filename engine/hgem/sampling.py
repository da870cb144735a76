"""Two-stage sampling of synthetic households from a product mixture (H-GEM paper §4.2, "Sampling").

For each household: pick a mixture component k (by its weight; the B sub-populations of GEM
appendix B.1 are equally weighted until the private update moves the weights), draw the group
attributes from F_G(z_k) and the size m ~ F_c(z_k), then draw m persons, the j-th from the slot distribution F_I,j(z_k) ("the first row is sampled
from F_I,1(z_k), the second from F_I,2(z_k), etc."). Slot 1 is the householder (person row 0 of the
household in HierarchicalData).

Household structure (:class:`HouseholdStructure`, optional; the release passes the domain's): the
paper draws every attribute of every slot independently given the component, so a household may
get no householder or several, and its householder attributes (HHLDR_SEX …) may disagree with its
first person. With a structure the released microdata are coherent, as the input encoding makes
them (``schemas.domain_spec.DomainSpec.encode``):

* relationship: slot 1 is drawn from F_I,1(z_k) conditioned on "householder" (in a one-person
  household, when one-person group-quarters households exist, on "householder or group-quarters
  resident", so those keep their learnt share); slots ≥ 2 from F_I,j(z_k) conditioned on "neither
  householder nor group-quarters resident". Conditioning zeroes the excluded codes' probabilities
  inside the same inverse-CDF draw (which renormalises); a row whose allowed codes all have
  probability 0 draws uniformly among them. Exactly one householder per household, as the release
  gate requires (it counts the resident of a one-person group-quarters household as its head);
* householder attributes (``derive: householder``) are copied from slot 1's drawn person
  attributes instead of being drawn from F_G(z_k): the household attribute is *defined* as the
  householder's value, so deriving it is the only way both tables agree (F_G's head for it and
  F_I,1's have learnt the same marginal, so the choice costs no fit);
* any-person indicators (``derive: any_person``, e.g. R18 = some person aged 0-17) are likewise
  derived from the drawn persons of the household (slots ≤ m).
* Not derived: attributes that need information the persons do not carry (MULTG needs the detailed
  relationship codes, which RELP_GROUP merges); those stay draws from F_G(z_k).

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

from dataclasses import dataclass

import numpy as np
import torch

from engine.data import Domain, HierarchicalData
from engine.hgem.mixture import ProductMixture


@dataclass(frozen=True)
class AnyPerson:
    """Group attribute ``group`` = code index 1 when some person's ``person`` attribute is one of
    ``codes`` (release codes), else 0 (``derive: any_person`` of the domain spec)."""

    group: str
    person: str
    codes: tuple[str, ...]


@dataclass(frozen=True)
class HouseholdStructure:
    """The household rules the sampler keeps (module docstring), in release codes of the domain.

    relationship             person attribute holding the relationship to the householder (None:
                             the release does not keep it; no relationship constraint)
    householder              its code of the householder
    group_quarters           its codes of group-quarters residents (never in a multi-person household)
    group_quarters_households  whether one-person group-quarters households exist (ingestion rule
                             ``single_person_households``): slot 1 of a one-person household may
                             then be a group-quarters resident
    householder_attributes   (group attribute, person attribute) pairs, ``derive: householder``
    any_person               ``derive: any_person`` indicators
    """

    relationship: str | None = None
    householder: str | None = None
    group_quarters: tuple[str, ...] = ()
    group_quarters_households: bool = False
    householder_attributes: tuple[tuple[str, str], ...] = ()
    any_person: tuple[AnyPerson, ...] = ()

    def __post_init__(self) -> None:
        if (self.relationship is None) != (self.householder is None):
            raise ValueError("HouseholdStructure: relationship and householder go together")
        if self.householder is not None and self.householder in self.group_quarters:
            raise ValueError("HouseholdStructure: the householder code is not a group-quarters code")

    def check(self, domain: Domain) -> None:
        """Raise ValueError when an attribute or code is not in ``domain``."""
        if self.relationship is not None:
            codes = domain.person_attribute(self.relationship).codes
            for c in (self.householder, *self.group_quarters):
                if c not in codes:
                    raise ValueError(f"HouseholdStructure: {c!r} is not a code of {self.relationship}")
        for g, p in self.householder_attributes:
            if domain.group_attribute(g).codes != domain.person_attribute(p).codes:
                raise ValueError(f"HouseholdStructure: {g} and {p} have different codes")
        for a in self.any_person:
            if len(domain.group_attribute(a.group).codes) != 2:
                raise ValueError(f"HouseholdStructure: {a.group} is not a two-code indicator")
            person_codes = domain.person_attribute(a.person).codes
            if any(c not in person_codes for c in a.codes):
                raise ValueError(f"HouseholdStructure: a code of {a.codes} is not a code of {a.person}")

    @property
    def derived_group(self) -> tuple[str, ...]:
        """The group attributes derived from the persons (not drawn from F_G)."""
        return tuple(g for g, _ in self.householder_attributes) + tuple(a.group for a in self.any_person)

    def relationship_mask(self, domain: Domain, size_idx: torch.Tensor) -> torch.Tensor:
        """(n, M, s) bool: the relationship codes slot j of each household may take (module doc)."""
        if self.relationship is None or self.householder is None:
            raise ValueError("HouseholdStructure: no relationship attribute to constrain")
        codes = domain.person_attribute(self.relationship).codes
        head, gq = codes.index(self.householder), [codes.index(c) for c in self.group_quarters]
        n, M, dev = int(size_idx.shape[0]), domain.max_size, size_idx.device
        others = torch.ones(len(codes), dtype=torch.bool, device=dev)
        others[[head, *gq]] = False
        mask = others.expand(n, M, len(codes)).clone()
        mask[:, 0] = False
        mask[:, 0, head] = True
        if self.group_quarters_households and gq:
            mask[:, 0, gq] = (size_idx == 0).unsqueeze(1)
        return mask


def conditioned(probs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``probs`` (rows × codes) restricted to the ``allowed`` codes (unnormalised: the inverse-CDF
    draw scales by the row total); a row whose allowed codes all have probability 0 gets them
    uniformly."""
    p = probs.to(torch.float64) * allowed
    return torch.where(p.sum(-1, keepdim=True) > 0, p, allowed.to(torch.float64))


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
    structure: HouseholdStructure | None = None,
) -> HierarchicalData:
    """Draw ``n_households`` synthetic households from ``mix`` into a HierarchicalData.

    geo: one node (tuple of codes for every level of ``domain.geography``) given to all
    households, an (n, L) array, or None (all zeros). Randomness comes from ``generator`` if
    given, else from a torch.Generator seeded with ``seed`` on the mixture's device.
    structure: the household rules to keep (module docstring); None: every attribute drawn as the
    paper does.
    """
    lay = mix.layout
    dom = lay.domain
    dev = mix.device
    if structure is not None:
        structure.check(dom)
    derived = set(structure.derived_group) if structure is not None else set()
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
        for name in (a for a in lay.group_names if a not in derived):
            group[:, dom.group_index(name)] = _categorical(group_probs[:, lay.group_slice(name)], generator, comp)
        # persons: all M slots of every household, then keep slot < m (row-major → CSR order)
        slot_probs = mix.person_probs[comp]  # (n, M, D_I)
        person = torch.empty(n, M, len(dom.person), dtype=torch.long, device=dev)
        slot_strata = (comp.unsqueeze(1) * M + torch.arange(M, device=dev)).reshape(-1)  # (component, slot)
        for j, name in enumerate(lay.person_names):
            pr = slot_probs[:, :, lay.person_slice(name)]
            if structure is not None and name == structure.relationship:
                pr = conditioned(pr, structure.relationship_mask(dom, size_idx))
            person[:, :, j] = _categorical(pr.reshape(n * M, -1), generator, slot_strata).view(n, M)
        keep = torch.arange(M, device=dev).unsqueeze(0) <= size_idx.unsqueeze(1)  # (n, M)
        if structure is not None:
            for hh_attr, p_attr in structure.householder_attributes:
                group[:, dom.group_index(hh_attr)] = person[:, 0, dom.person_index(p_attr)]
            for a in structure.any_person:
                wanted = torch.tensor([dom.person_attribute(a.person).codes.index(c) for c in a.codes], device=dev)
                hit = torch.isin(person[:, :, dom.person_index(a.person)], wanted) & keep
                group[:, dom.group_index(a.group)] = hit.any(1).to(torch.long)
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
