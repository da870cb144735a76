"""The household structure a domain spec declares, as the H-GEM sampler keeps it
(:class:`engine.hgem.sampling.HouseholdStructure`): the householder marker the release gate
checks (:func:`schemas.release_expectations.householder_of`), whether one-person group-quarters
households exist, and the household attributes derived from the persons (``derive: householder``,
``derive: any_person``) that the release keeps (``DomainSpec.derived``)."""

from __future__ import annotations

from engine.data import Domain
from engine.hgem.sampling import AnyPerson, HouseholdStructure
from schemas.domain_spec import DomainSpec
from schemas.release_expectations import householder_of


def household_structure(spec: DomainSpec, domain: Domain, group_quarters_households: bool = False) -> HouseholdStructure:
    """``spec``'s household structure on ``domain`` (its kept attributes).
    ``group_quarters_households``: the ingestion rule ``group_quarters: single_person_households``."""
    head = householder_of(spec, domain)
    derived = spec.derived(domain)
    return HouseholdStructure(
        relationship=head.attribute if head else None,
        householder=head.code if head else None,
        group_quarters=head.group_quarters if head else (),
        group_quarters_households=group_quarters_households,
        householder_attributes=tuple((n, str(h.attribute)) for n, h in derived["householder"].items()),
        any_person=tuple(AnyPerson(n, str(h.attribute), tuple(h.values or ())) for n, h in derived["any_person"].items()),
    )
