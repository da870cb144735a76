"""The YAML domain spec (``schemas/domains/*.yaml``) as a validated pydantic model, and the
vectorised encoding of validated raw person columns into :class:`engine.HierarchicalData`.

The spec declares the source columns (type, codes, ranges, blanks), the person attributes
(kept PUMS codes, numeric bins or code groups) and the household attributes derived from the
persons. See the comments at the top of ``domains/acs_pums.yaml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from engine.data import Attribute, Domain, HierarchicalData, bin_ranges, map_codes, multigenerational, segment_any
from engine.errors import EXIT_BAD_INPUT, DPReleaseError
from engine.synthesis import Flip

DOMAINS_DIR = Path(__file__).parent / "domains"


class DomainSpecError(DPReleaseError, ValueError):
    """A domain spec that cannot be read, or a setting the domain cannot take (exit 2)."""

    exit_code = EXIT_BAD_INPUT


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Documented(_Strict):
    """Every column and attribute carries its meaning, so that none ships undocumented: the
    release's data dictionary (``schemas.data_dictionary``) is generated from these fields."""

    description: str = Field(min_length=1)
    universe: str = Field(min_length=1)


class SourceColumn(_Documented):
    type: Literal["id", "int", "code"]
    min: int | None = None
    max: int | None = None
    codes: list[int] | None = None
    blank: bool = False
    derivable: bool = False  # may be absent in a layout that lets the reader derive it

    @model_validator(mode="after")
    def _check(self):
        if self.type == "code" and not self.codes:
            raise ValueError("a 'code' column needs its list of codes")
        if self.type == "int" and (self.min is None or self.max is None):
            raise ValueError("an 'int' column needs min and max")
        return self

    def describe(self) -> str:
        if self.type == "int":
            return f"an integer {self.min}..{self.max}"
        if self.type == "code":
            c = self.codes or []
            shown = f"{c[0]}..{c[-1]}" if c == list(range(c[0], c[-1] + 1)) else ", ".join(map(str, c))
            return f"one of the codes {shown}" + (" or blank" if self.blank else "")
        return "a non-empty identifier"


class Bin(_Strict):
    label: str
    min: int
    max: int


class CodeGroup(_Strict):
    label: str
    codes: list[int | None]


class PersonAttributeSpec(_Documented):
    source: str
    codes: dict[str, str] | None = None  # release code -> label, kept as in PUMS
    bins: list[Bin] | None = None
    groups: list[CodeGroup] | None = None

    @model_validator(mode="after")
    def _one_kind(self):
        if sum(x is not None for x in (self.codes, self.bins, self.groups)) != 1:
            raise ValueError("a person attribute needs exactly one of codes, bins, groups")
        if self.bins:
            for a, b in zip(self.bins, self.bins[1:]):
                if not (a.min <= a.max < b.min <= b.max):
                    raise ValueError(f"bins must be sorted and disjoint: {a.label!r} then {b.label!r}")
        return self

    def attribute(self, name: str) -> Attribute:
        """The released attribute. Every release code is short (see the header of
        ``domains/acs_pums.yaml``): a kept variable's PUMS code, a bin's range, a group's number
        1..k in the order listed; the labels say in words what each code means."""
        if self.codes is not None:
            return Attribute(name, tuple(self.codes), tuple(self.codes.values()), self.description)
        if self.bins is not None:
            return Attribute(name, tuple(b.label for b in self.bins),
                             tuple(f"{self.source} {b.min} to {b.max}" for b in self.bins), self.description)
        groups = self.groups or []
        return Attribute(name, tuple(str(i) for i in range(1, len(groups) + 1)), tuple(g.label for g in groups), self.description)

    def encode(self, values: np.ndarray) -> np.ndarray:
        if self.codes is not None:
            return map_codes(values, [[int(c)] for c in self.codes])
        if self.bins is not None:
            return bin_ranges(values, np.array([b.min for b in self.bins]), np.array([b.max for b in self.bins]))
        return map_codes(values, [g.codes for g in self.groups])  # type: ignore[union-attr]  # the validator requires exactly one of codes/bins/groups


class HouseholdAttributeSpec(_Documented):
    derive: Literal["size", "householder", "any_person", "multigenerational"]
    attribute: str | None = None
    values: list[str] | None = None
    codes: dict[str, str] | None = None
    source: str | None = None
    child_codes: list[int] | None = None
    grandchild_codes: list[int] | None = None
    parent_codes: list[int] | None = None


class DomainSpec(_Strict):
    name: str
    geography: list[str]
    source_columns: dict[str, SourceColumn]
    householder_code: int
    group_quarters_codes: list[int]
    person_attributes: dict[str, PersonAttributeSpec]
    household_attributes: dict[str, HouseholdAttributeSpec]
    relationship_column: str = "RELP"

    @model_validator(mode="after")
    def _check_refs(self):
        for name, a in self.person_attributes.items():
            if a.source not in self.source_columns:
                raise ValueError(f"person attribute {name}: unknown source column {a.source}")
        for name, h in self.household_attributes.items():
            if h.derive in ("householder", "any_person") and h.attribute not in self.person_attributes:
                raise ValueError(f"household attribute {name}: unknown person attribute {h.attribute}")
            if h.derive in ("any_person", "multigenerational") and not h.codes:
                raise ValueError(f"household attribute {name}: needs codes (release code -> label)")
        if sum(h.derive == "size" for h in self.household_attributes.values()) != 1:
            raise ValueError("exactly one household attribute must derive the size")
        for g in self.geography:
            if g not in self.source_columns:
                raise ValueError(f"geography level {g} is not a source column")
        return self

    @property
    def size_attribute(self) -> str:
        return next(n for n, h in self.household_attributes.items() if h.derive == "size")

    def derived(self, domain: Domain) -> dict[str, dict[str, HouseholdAttributeSpec]]:
        """The household attributes ``domain`` keeps that derive from one of its person
        attributes, by how: ``"householder"`` (the householder's value) and ``"any_person"``
        (whether any member has one of ``values``), each name → its spec, in the spec's order.
        The one statement of which household attributes follow a person attribute: the sampler
        keeps them (``schemas.household_structure``), and a prior flip of a person attribute
        carries the householder-derived ones and cannot carry the others (:meth:`prior_flips`)."""
        groups, persons = {a.name for a in domain.group}, {a.name for a in domain.person}
        out: dict[str, dict[str, HouseholdAttributeSpec]] = {"householder": {}, "any_person": {}}
        for n, h in self.household_attributes.items():
            if h.derive in out and n in groups and h.attribute in persons:
                out[h.derive][n] = h
        return out

    def prior_flips(self, names: list[str] | tuple[str, ...], domain: Domain) -> tuple[Flip, ...]:
        """``advanced.synthesis.prior_flips`` as :class:`engine.synthesis.Flip` templates: each named
        person attribute with the household attributes this spec derives from its householder's
        value (those of ``domain``). A household attribute derived from the attribute otherwise
        (``any_person``) would not stay consistent under a relabelling, so it is refused, as is the
        relationship and an attribute ``domain`` cannot relabel."""
        derived = self.derived(domain)
        flips = []
        for name in names:
            if name in self.person_attributes and self.person_attributes[name].source == self.relationship_column:
                raise DomainSpecError(f"advanced.synthesis.prior_flips: {name} is the relationship, which marks the householder and the "
                                      "household's structure: it cannot be relabelled")
            other = sorted(n for n, h in derived["any_person"].items() if h.attribute == name)
            if other:
                raise DomainSpecError(f"advanced.synthesis.prior_flips: household attributes {other} derive from {name} other than by its "
                                      "householder's value and would not follow the flip")
            flip = Flip(name, tuple(sorted(n for n, h in derived["householder"].items() if h.attribute == name)))
            try:
                flip.check(domain)
            except ValueError as e:
                raise DomainSpecError(f"advanced.synthesis.prior_flips: {e}") from None
            flips.append(flip)
        return tuple(flips)

    def flippable(self, domain: Domain) -> tuple[Flip, ...]:
        """Every person attribute of ``domain`` that :meth:`prior_flips` can relabel (no kept
        household attribute derives from it other than by its householder's value, and those that
        do are coded like it; not the relationship, which marks the householder and the household's
        structure), in the domain's order: the prior mixture's default, whatever the domain. A
        binary attribute is flipped; a multi-valued one is a template whose two codes each state's
        measurements choose (``engine.synthesis._prior_mixture.choose_swaps``, which also leaves out
        the attributes a household's persons do not mostly share)."""
        derived = self.derived(domain)
        blocked = {h.attribute for h in derived["any_person"].values()}
        blocked |= {n for n, a in self.person_attributes.items() if a.source == self.relationship_column}
        out = []
        for a in domain.person:
            by_householder = [n for n, h in derived["householder"].items() if h.attribute == a.name]
            if a.name not in blocked and all(domain.group_attribute(n).codes == a.codes for n in by_householder):
                out.append(a.name)
        return self.prior_flips(out, domain)

    def domain(self, max_size: int) -> Domain:
        person = tuple(a.attribute(n) for n, a in self.person_attributes.items())
        by_name = {a.name: a for a in person}
        group = []
        for n, h in self.household_attributes.items():
            if h.derive == "size":
                codes = tuple(str(i) for i in range(1, max_size + 1))
                group.append(Attribute(n, codes, codes, h.description))
            elif h.derive == "householder":
                src = by_name[h.attribute]  # type: ignore[index]  # _check_refs requires a known attribute for "householder"
                group.append(Attribute(n, src.codes, src.labels, h.description))
            else:
                group.append(Attribute(n, tuple(h.codes), tuple(h.codes.values()), h.description))  # type: ignore[arg-type,union-attr]  # _check_refs requires codes here
        return Domain(tuple(group), person, tuple(self.geography), max_size, self.size_attribute)

    # -- encoding --------------------------------------------------------------------
    def encode(self, cols: dict[str, np.ndarray], household: np.ndarray, max_size: int) -> tuple[HierarchicalData, dict]:
        """Encode validated persons into HierarchicalData.

        ``cols``: source column -> int64 array (blank = -1), persons already filtered by the
        group-quarters rule and sorted by household with the householder first;
        ``household``: household index of each person (0..n-1, nondecreasing). Households with
        more than ``max_size`` persons must already be clipped or excluded by the caller.
        """
        domain = self.domain(max_size)
        n_hh = int(household[-1]) + 1 if len(household) else 0
        offsets = np.concatenate([[0], np.cumsum(np.bincount(household, minlength=n_hh))]).astype(np.int64)
        person = np.empty((len(household), len(domain.person)), dtype=np.int64)
        for j, (name, a) in enumerate(self.person_attributes.items()):
            person[:, j] = a.encode(cols[a.source])
            if np.any(person[:, j] < 0):  # validation guarantees this cannot happen
                raise ValueError(f"attribute {name}: values outside the spec after validation")
        group = np.empty((n_hh, len(domain.group)), dtype=np.int64)
        pidx = {n: i for i, n in enumerate(self.person_attributes)}
        first = offsets[:-1]
        for j, (_, h) in enumerate(self.household_attributes.items()):
            if h.derive == "size":
                group[:, j] = np.diff(offsets) - 1
            elif h.derive == "householder":
                group[:, j] = person[first, pidx[h.attribute]]  # type: ignore[index]  # attribute required by _check_refs; numpy stubs reject int column indices
            elif h.derive == "any_person":
                attr = domain.person_attribute(h.attribute)  # type: ignore[arg-type]  # _check_refs requires a known attribute for "any_person"
                wanted = [attr.codes.index(v) for v in h.values or []]
                group[:, j] = segment_any(np.isin(person[:, pidx[h.attribute]], wanted), offsets)  # type: ignore[index]  # as above
            else:
                group[:, j] = multigenerational(
                    cols[h.source or self.relationship_column], offsets, h.child_codes or [], h.grandchild_codes or [], h.parent_codes or []
                )
        geo = np.stack([cols[g][first] for g in self.geography], axis=1) if n_hh else np.zeros((0, len(self.geography)))
        data = HierarchicalData.from_arrays(domain, geo, group, person, offsets)
        return data, {"households": n_hh, "persons": int(len(household))}


def domain_spec_path(domain: str | Path) -> Path:
    """A domain spec's file: a ``.yaml``/``.yml`` path as given (resolved), or the name of a spec
    shipped in ``schemas/domains/`` (``acs_pums``, ``acs_pums_core``, ``acs_pums_aim``)."""
    p = Path(domain)
    if p.suffix in (".yaml", ".yml"):
        return p.resolve()
    return DOMAINS_DIR / f"{domain}.yaml"


def load_domain_spec(path: str | Path = DOMAINS_DIR / "acs_pums.yaml") -> DomainSpec:
    """Load a domain spec from a path or a shipped spec's name (:func:`domain_spec_path`)."""
    path = domain_spec_path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise DomainSpecError(f"{path}: cannot read the domain spec ({e.strerror}); expected a YAML file or the name of a shipped "
                              f"spec ({', '.join(sorted(q.stem for q in DOMAINS_DIR.glob('*.yaml')))})") from None
    except yaml.YAMLError as e:
        raise DomainSpecError(f"{path}: the domain spec is not valid YAML: {e}") from None
    try:
        return DomainSpec.model_validate(raw)
    except Exception as e:  # pydantic.ValidationError
        raise DomainSpecError(f"{path}: invalid domain spec: {e}") from None

