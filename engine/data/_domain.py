"""The attribute domain of a hierarchical dataset: which attributes, which categories.

Every attribute is categorical and encoded as a small integer ``0..size-1``. Each category has a
release *code* (the short string written into the public files: a PUMS code such as ``"1"`` for SEX,
a bin's range such as ``"25-34"`` for AGEP_BAND, a group's number such as ``"2"`` for HISP_ORIGIN)
and a human-readable *label*. An attribute's *description* says what it measures; it is
documentation only and takes no part in comparing domains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Attribute:
    name: str
    codes: tuple[str, ...]
    labels: tuple[str, ...]
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if len(self.codes) != len(self.labels):
            raise ValueError(f"attribute {self.name}: {len(self.codes)} codes but {len(self.labels)} labels")
        if len(self.codes) == 0:
            raise ValueError(f"attribute {self.name}: no categories")
        if len(set(self.codes)) != len(self.codes):
            raise ValueError(f"attribute {self.name}: duplicate release codes {self.codes}")

    @property
    def size(self) -> int:
        return len(self.codes)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "codes": list(self.codes), "labels": list(self.labels), "description": self.description}


@dataclass(frozen=True)
class Domain:
    """Group (household) attributes, person attributes, geography levels and the size cap M.

    ``group`` always contains ``NP`` (household size) with codes ``"1".."M"``, so household size
    is an ordinary group attribute for queries.
    """

    group: tuple[Attribute, ...]
    person: tuple[Attribute, ...]
    geography: tuple[str, ...]
    max_size: int
    size_attribute: str = "NP"

    def __post_init__(self) -> None:
        names = [a.name for a in self.group] + [a.name for a in self.person]
        if len(set(names)) != len(names):
            raise ValueError(f"attribute names must be unique across group and person attributes: {names}")
        if self.size_attribute not in [a.name for a in self.group]:
            raise ValueError(f"group attributes must include the size attribute {self.size_attribute}")
        size_attr = self.group_attribute(self.size_attribute)
        if size_attr.codes != tuple(str(i) for i in range(1, self.max_size + 1)):
            raise ValueError(f"{self.size_attribute} codes must be '1'..'{self.max_size}'")

    def project(self, group: list[str] | None, person: list[str] | None) -> Domain:
        """The domain of a subset of the attributes (None keeps all of a kind; the size attribute
        is always kept)."""
        g_names = [a.name for a in self.group] if group is None else list(dict.fromkeys([self.size_attribute, *group]))
        p_names = [a.name for a in self.person] if person is None else list(dict.fromkeys(person))
        return Domain(tuple(self.group_attribute(n) for n in g_names), tuple(self.person_attribute(n) for n in p_names),
                      self.geography, self.max_size, self.size_attribute)

    # -- look-ups -------------------------------------------------------------------------
    def group_index(self, name: str) -> int:
        for i, a in enumerate(self.group):
            if a.name == name:
                return i
        raise KeyError(f"no group attribute {name!r}; have {[a.name for a in self.group]}")

    def person_index(self, name: str) -> int:
        for i, a in enumerate(self.person):
            if a.name == name:
                return i
        raise KeyError(f"no person attribute {name!r}; have {[a.name for a in self.person]}")

    def group_attribute(self, name: str) -> Attribute:
        return self.group[self.group_index(name)]

    def person_attribute(self, name: str) -> Attribute:
        return self.person[self.person_index(name)]

    @property
    def group_sizes(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.group)

    @property
    def person_sizes(self) -> tuple[int, ...]:
        return tuple(a.size for a in self.person)

    def to_dict(self) -> dict[str, Any]:
        return {
            "geography": list(self.geography),
            "max_size": self.max_size,
            "size_attribute": self.size_attribute,
            "group": [a.to_dict() for a in self.group],
            "person": [a.to_dict() for a in self.person],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Domain:
        def mk(a: dict[str, Any]) -> Attribute:
            return Attribute(a["name"], tuple(a["codes"]), tuple(a["labels"]), a.get("description", ""))

        return cls(
            group=tuple(mk(a) for a in d["group"]),
            person=tuple(mk(a) for a in d["person"]),
            geography=tuple(d["geography"]),
            max_size=int(d["max_size"]),
            size_attribute=d.get("size_attribute", "NP"),
        )
