"""The release's data dictionary, generated from the domain spec: every released column with its
description, universe, type, the rule that makes it and, for a categorical column, every code with
its label. It ships in ``domain.json`` (key ``dictionary``) beside the domain's codes and labels,
which ``Domain.from_dict`` reads as before.
"""

from __future__ import annotations

from engine.data import Attribute, Domain
from schemas.domain_spec import DomainSpec, HouseholdAttributeSpec, PersonAttributeSpec
from schemas.release_schema import RELEASE_COLUMNS, WEIGHT, WEIGHT_DESCRIPTION

CONVENTION = (
    "Every column of the microdata holds a short code, as the Census Bureau's PUMS files do, and this dictionary maps "
    "each code to its label: a PUMS variable kept as it is holds its PUMS code (SEX = 2 is Female); a binned variable "
    "holds the bin's range (AGEP_BAND = 25-34); a grouped variable holds the group's number in the order listed here "
    "(HISP_ORIGIN = 2 is Hispanic or Latino); a householder attribute (HHLDR_*) holds the code of the person attribute it "
    "copies. Codes are short, sort and compare without typing a label, and are the same in the microdata, in "
    "measurements.parquet and intervals.parquet (cell_codes) and in `dprelease query`, which prints a <ATTR>_label "
    "column beside every code.")
UNWEIGHTED = (
    "The microdata are an unweighted synthetic sample: every synthetic household and person counts once. Counts of the "
    "microdata estimate the population of the households covered by the release (a state's synthetic households number "
    "about its noisy household count), not survey-weighted ACS estimates; no column is a weight. A weight calibrated to "
    "public totals can be added with the release config's `weights: {totals: <csv>}`.")
WEIGHTED = (
    "The microdata are a synthetic sample; WEIGHT (households and persons) is a household weight calibrated by raking to the "
    "public totals named in manifest.json's weights entry, so that weighted counts reproduce those totals. Unweighted counts "
    "are counts of synthetic records; use WEIGHT to estimate population totals.")
READING = (
    "ST and PUMA are hive partition keys (households/ST=50/PUMA=00100/part-0.parquet); read them as strings, or "
    "pandas/pyarrow infer integers and PUMA 00100 becomes 100:\n"
    "  import pyarrow as pa, pyarrow.dataset as ds\n"
    "  part = ds.partitioning(pa.schema([('ST', pa.string()), ('PUMA', pa.string())]), flavor='hive')\n"
    "  households = ds.dataset('households', format='parquet', partitioning=part).to_table().to_pandas()\n"
    "  persons = ds.dataset('persons', format='parquet', partitioning=part).to_table().to_pandas()\n"
    "  labels = {a['name']: dict(zip(a['codes'], a['labels'])) for a in domain['group'] + domain['person']}  # domain = json.load(open('domain.json'))\n"
    "  persons['SEX_label'] = persons.SEX.map(labels['SEX'])")


def _codes(attr: Attribute, sources: list[str] | None = None) -> list[dict]:
    return [{"code": c, "label": lab, **({"from": sources[i]} if sources else {})} for i, (c, lab) in enumerate(zip(attr.codes, attr.labels))]


def _ranges(codes: list[int | None]) -> str:
    """``[2, 3, 4, 7]`` as ``2-4, 7``; ``None`` (a blank cell) as ``blank``."""
    out: list[str] = []
    run: list[int] = []
    for c in [c for c in codes if c is not None] + [None]:
        if c is not None and run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
        run = [] if c is None else [c]
    return ", ".join(out + (["blank"] if None in codes else []))


def _person_rule(spec: PersonAttributeSpec, attr: Attribute) -> tuple[str, list[str] | None]:
    if spec.codes is not None:
        return f"PUMS {spec.source} as it is (its PUMS code)", None
    if spec.bins is not None:
        return (f"PUMS {spec.source} binned: the code is the bin's range of {spec.source}",
                [f"{spec.source} {b.min}-{b.max}" for b in spec.bins])
    groups = spec.groups or []
    return (f"PUMS {spec.source} grouped: the code is the group's number 1..{len(groups)}",
            [f"{spec.source} {_ranges(g.codes)}" for g in groups])


def _household_rule(spec: HouseholdAttributeSpec, domain_spec: DomainSpec, max_size: int, oversize: str, group_quarters: str) -> str:
    relp = domain_spec.relationship_column
    head = (f"the householder (SPORDER 1: the person with {relp} {domain_spec.householder_code}"
            + (", or the resident of a one-person group-quarters household)" if group_quarters == "single_person_households" else ")"))
    if spec.derive == "size":
        cut = (f"kept their householder and the next {max_size - 1} persons by SPORDER" if oversize == "clip" else "were left out")
        return f"the number of persons of the household, 1..{max_size}; input households of more than {max_size} persons {cut}"
    if spec.derive == "householder":
        return f"{spec.attribute} of {head}, in {spec.attribute}'s codes"
    if spec.derive == "any_person":
        return f"1 when at least one person of the household has {spec.attribute} in {{{', '.join(spec.values or [])}}}, else 0"
    src = spec.source or relp
    child, grand, parent = (_ranges(list(c or [])) for c in (spec.child_codes, spec.grandchild_codes, spec.parent_codes))
    return (f"2 when the household holds at least two of: a child of {head} ({src} {child}), a grandchild ({src} {grand}), "
            f"a parent or parent-in-law ({src} {parent}) — the PUMS MULTG rule; else 1")


def data_dictionary(spec: DomainSpec, domain: Domain, oversize: str = "clip", group_quarters: str = "exclude") -> dict:
    """The dictionary of a release of ``domain`` (made from ``spec``) under the household rules
    ``oversize`` and ``group_quarters`` (the config's ``household_rules``). Its ``weights`` entry is
    the unweighted statement; :func:`with_weights` replaces it when a weight is calibrated."""
    src = spec.source_columns
    gq = ("group-quarters persons are left out" if group_quarters == "exclude"
          else "each group-quarters person is a one-person household")
    universe = f"the synthetic households of the released states and their persons; {gq}"
    universe_h = spec.household_attributes[domain.size_attribute].universe
    universe_p = next(iter(spec.person_attributes.values())).universe

    def fixed(name: str, universe: str, typ: str) -> dict:
        return {"name": name, "type": typ, "description": src[name].description, "universe": universe, "rule": RELEASE_COLUMNS[name]}

    households = [fixed("ST", universe_h, "string"), fixed("PUMA", universe_h, "string"), fixed("SERIALNO", universe_h, "string")]
    for a in domain.group:
        h = spec.household_attributes[a.name]
        entry: dict[str, str | list[dict]] = {"name": a.name, "type": "int8" if a.name == domain.size_attribute else "string", "description": h.description,
                 "universe": h.universe, "rule": _household_rule(h, spec, domain.max_size, oversize, group_quarters)}
        if a.name != domain.size_attribute:
            entry["codes"] = _codes(a)
        households.append(entry)
    persons = [fixed("ST", universe_p, "string"), fixed("PUMA", universe_p, "string"), fixed("SERIALNO", universe_p, "string"),
               fixed("SPORDER", universe_p, "int8")]
    for a in domain.person:
        p = spec.person_attributes[a.name]
        rule, sources = _person_rule(p, a)
        persons.append({"name": a.name, "type": "string", "description": p.description, "universe": p.universe,
                        "source": {"column": p.source, "description": src[p.source].description, "universe": src[p.source].universe},
                        "rule": rule, "codes": _codes(a, sources)})
    return {"universe": universe, "convention": CONVENTION, "weights": UNWEIGHTED, "reading": READING,
            "tables": {"households": households, "persons": persons}}


def with_weights(dictionary: dict) -> dict:
    """The dictionary of a release whose households and persons carry the calibrated ``WEIGHT``."""
    weight = {"name": WEIGHT, "type": "float64", "description": WEIGHT_DESCRIPTION, "universe": "",
              "rule": "raking (engine.synthesis) of weights starting at 1 to the public totals; a person gets their household's weight"}
    tables = dictionary["tables"]
    return {**dictionary, "weights": WEIGHTED,
            "tables": {"households": tables["households"] + [{**weight, "universe": tables["households"][0]["universe"]}],
                       "persons": tables["persons"] + [{**weight, "universe": tables["persons"][0]["universe"]}]}}
